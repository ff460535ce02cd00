"""Fair share between principals: fleet-wide limits per principal (docs/limits.md).

A principal is who the app's auth says the caller is (a digest of client id,
issuer and subject) or, unauthenticated, the client's address (through the
trusted proxy hops) or one shared principal. Each shared resource a principal
can hold has a named limit here: handshake sessions (a cap), rounds (a rate
with a burst), MCP tasks (a cap and a share of the workers). Counts live in the
fleet's Redis, so they hold whichever replica or router serves a principal.

The package, by seam: who a request counts against (``_principal``), the limits
in force (``_rules``) and their file read again when it changes (``_watch``),
the counts in Redis (``_store``), the check on a request's path (``_limiter``),
what a refused principal is told (``_refused``), and the refusals remembered by
credential (``_refusals``).
"""

from mcpfleet.limits._limiter import (
    LEASE_LIFE,
    REDIS_BACKOFF,
    SESSION_LEASE,
    Limiter,
    LimitObserver,
)
from mcpfleet.limits._principal import (
    FORWARDED_FOR,
    SHARED,
    address_of,
    principal_digest,
    principal_of,
)
from mcpfleet.limits._refusals import (
    MAX_REMEMBERED,
    REFUSED_HEADER,
    Held,
    RefusalMemory,
    address_key,
    credential_key,
    format_refused,
    parse_refused,
)
from mcpfleet.limits._refused import Refusal
from mcpfleet.limits._rules import (
    CURRENT_PRINCIPAL,
    LIMIT_NAMES,
    Count,
    LimitRules,
    PrincipalRule,
    Rate,
    RulesError,
    load_rules,
    parse_rules,
)
from mcpfleet.limits._watch import POLL_INTERVAL, RulesWatcher

__all__ = [
    "CURRENT_PRINCIPAL",
    "FORWARDED_FOR",
    "LEASE_LIFE",
    "LIMIT_NAMES",
    "MAX_REMEMBERED",
    "POLL_INTERVAL",
    "REDIS_BACKOFF",
    "REFUSED_HEADER",
    "SESSION_LEASE",
    "SHARED",
    "Count",
    "Held",
    "LimitObserver",
    "LimitRules",
    "Limiter",
    "PrincipalRule",
    "Rate",
    "Refusal",
    "RefusalMemory",
    "RulesError",
    "RulesWatcher",
    "address_key",
    "address_of",
    "credential_key",
    "format_refused",
    "load_rules",
    "parse_refused",
    "parse_rules",
    "principal_digest",
    "principal_of",
]
