"""The contract shared by the replicas, the router and the operator.

Everything two mcpfleet components must agree on lives here and only here:
the key ring file inside the Secret, Redis key names, the attestation record a
replica publishes, HTTP header names and Kubernetes label names. The operator
imports this module; so does every part of the server package. Changing a
value here is a wire change between components of different versions.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# --- Key ring, as mounted from the Secret ------------------------------------

#: The Secret data key (and so the file name in the mounted volume) that holds
#: the ring. One file, so a ring is swapped as a whole, never key by key.
KEYRING_FILE = "keyring.json"

#: Version of the key ring document; readers refuse versions they do not know.
KEYRING_FORMAT_VERSION = 1

#: Where a rotation stands, as recorded in the ring document itself, so that
#: the Secret alone tells a restarted operator (or `mcpfleet keys`) what next.
RingPhase = Literal["stable", "staged", "promoted"]
RING_PHASES: tuple[RingPhase, ...] = ("stable", "staged", "promoted")

# --- HTTP ---------------------------------------------------------------------

#: Every response that passed through the fleet names the replica that served it.
REPLICA_HEADER = "X-Mcpfleet-Replica"
#: Set by a draining replica on the 503 it answers for work it will not take,
#: so a router may safely send that request elsewhere.
DRAINING_HEADER = "X-Mcpfleet-Draining"
#: Set on every error response the router made itself (never on one a replica
#: made), so a client or a person debugging can tell who refused a request.
ROUTER_ERROR_HEADER = "X-Mcpfleet-Router-Error"
#: Set by a replica on a 404 that means "no such session here" (it never had
#: it, or it ended), never on the 404 FastMCP answers a request whose credential
#: is not the one that opened a live session. The router forgets a session's
#: route only on this mark (or the owner's successful DELETE, or the owner
#: gone); it strips the header from client requests and from every response.
SESSION_ENDED_HEADER = "X-Mcpfleet-Session-Ended"
#: Set by a replica on the answer to an ``initialize`` that opened a session
#: when the request carried a verified credential: a digest of the principal
#: (client id, issuer, subject), never the token. The router keeps it to check
#: that a re-home request (docs/rehome.md) comes from the session's owner.
PRINCIPAL_HEADER = "X-Mcpfleet-Principal"
#: Set to ``0`` by a replica on the answer to an ``initialize`` when its app
#: opted out of session re-homing (its sessions hold state of their own).
REHOME_HEADER = "X-Mcpfleet-Rehome"
#: Set by the router on a re-homed session's requests: the client's own session
#: id (the replica knows the session by its own). A replica draining with the
#: handover uses it to mark the session lost when its drain deadline cuts a
#: request of the session; stripped from client requests.
CLIENT_SESSION_HEADER = "X-Mcpfleet-Client-Session"
#: The ``lost`` mark (RedisKeys.session_lost) a replica writes for a session
#: whose request its drain deadline cut.
LOST_AT_DRAIN_DEADLINE = "drain_deadline"
SESSION_HEADER = "Mcp-Session-Id"
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
MCP_PATH = "/mcp"

# --- Redis ----------------------------------------------------------------------

DEFAULT_FLEET = "default"
_FLEET_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_fleet_name(fleet: str) -> str:
    """Return ``fleet`` if it is a valid fleet name (a DNS label), else raise ValueError."""
    if not _FLEET_NAME.match(fleet):
        raise ValueError(f"fleet name must be a DNS label (a-z, 0-9, '-'), got {fleet!r}")
    return fleet


def task_seals_of(tasks: str, kid: str) -> str:
    """:meth:`RedisKeys.task_seals` from the queue's name (:attr:`RedisKeys.tasks`)."""
    return f"{tasks}:sealed:{kid}"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The Redis keys of one handshake-era session (:meth:`RedisKeys.session_keys`)."""

    #: Its route (:meth:`RedisKeys.session`).
    route: str
    #: :meth:`RedisKeys.session_init`.
    init: str
    #: :meth:`RedisKeys.session_lost`.
    lost: str
    #: :meth:`RedisKeys.session_moving`.
    moving: str


@dataclass(frozen=True)
class RedisKeys:
    """Names of every Redis key mcpfleet uses, scoped by fleet.

    Several fleets (say, two Helm releases) may share one Redis: each key
    carries the fleet name. Keys hold routing facts, key ids and once-flows' results,
    never keys or credentials.

    On a Redis Cluster (``cluster``, from a ``redis+cluster://`` URL) some names
    carry a hash tag, so that every multi-key operation stays in one hash slot
    while the data spreads over the shards: a session's keys are tagged by the
    session (``mcpfleet:<fleet>:session:{<id>}[:init|:lost|:moving]``), a
    once-flow's by the flow, the registry set and the attestations by the fleet
    (``mcpfleet:{<fleet>}:replicas``, ``mcpfleet:{<fleet>}:replica:<name>``: one
    slot), the task queue's keys by the queue (``{mcpfleet:<fleet>:tasks}:...``,
    the queue's library's own tag). Without ``cluster`` every name is as it
    always was, so a standalone or Sentinel fleet keeps its routes across an upgrade.
    """

    fleet: str = DEFAULT_FLEET
    cluster: bool = False

    def __post_init__(self) -> None:
        check_fleet_name(self.fleet)

    @property
    def prefix(self) -> str:
        return f"mcpfleet:{self.fleet}"

    @property
    def _fleet_slot(self) -> str:
        """The prefix of the registry's keys: one hash slot for them all on a cluster."""
        return f"mcpfleet:{{{self.fleet}}}" if self.cluster else self.prefix

    def _tag(self, part: str) -> str:
        """``{part}`` on a cluster: a hash tag, the same for every key built around
        ``part``. Redis hashes the text from the first ``{`` to the next ``}``; an id
        starting with ``}`` (never one mcpfleet makes) would give an empty tag, which
        Redis ignores, so it is tagged ``{%}...}``: all such ids share one slot."""
        if not self.cluster:
            return part
        return f"{{%{part}}}" if part.startswith("}") else f"{{{part}}}"

    @property
    def replicas(self) -> str:
        """A set of the names of replicas that have ever registered (pruned lazily)."""
        return f"{self._fleet_slot}:replicas"

    def replica(self, name: str) -> str:
        """The attestation record of one replica (JSON), expiring with its heartbeat."""
        return f"{self._fleet_slot}:replica:{name}"

    def session(self, session_id: str) -> str:
        """The route of one handshake-era session: its owner (replica name), or,
        for a re-homed session, the owner and the owner's session id, space-separated."""
        return f"{self.prefix}:session:{self._tag(session_id)}"

    def session_init(self, session_id: str) -> str:
        """What re-opens one session elsewhere (router ``--rehome-sessions``): the
        client's ``initialize`` parameters and its owner's principal digest (JSON)."""
        return self.session_keys(session_id).init

    def session_lost(self, session_id: str) -> str:
        """Set (to a reason) when a session's owner went with work of the session in
        flight: the session is never re-homed, its next request gets the 404."""
        return self.session_keys(session_id).lost

    def session_moving(self, session_id: str) -> str:
        """Held (SET NX PX) by the one router re-homing a session right now."""
        return self.session_keys(session_id).moving

    def session_keys(self, session_id: str) -> SessionKeys:
        """Every key of one session, named at once: its route (:meth:`session`) and
        the three beside it, which the router reads and writes together."""
        route = self.session(session_id)
        return SessionKeys(route, f"{route}:init", f"{route}:lost", f"{route}:moving")

    def limit(self, name: str, principal: str) -> str:
        """One principal's count under the limit ``name`` (:mod:`mcpfleet.limits`): a
        rate's bucket (a string) or a cap's holdings (a sorted set of leases). Holds a
        principal's digest and counts, never a token, an address or a session's owner."""
        return f"{self.prefix}:limit:{name}:{principal}"

    def once(self, flow: str) -> str:
        """The ledger entry of one exactly-once guard flow (:mod:`mcpfleet.once`).

        Holds the flow's state and its final result, never answers or keys, and
        expires with the claim (at least the token TTL).
        """
        return f"{self.prefix}:once:{self._tag(flow)}"

    @property
    def tasks(self) -> str:
        """The name of the fleet's MCP task queue (:mod:`mcpfleet.tasks`, a Docket).

        Every key and pub/sub channel of the queue starts with ``<tasks>:``:
        its streams, execution records, results, and the engine's task records
        (task metadata, arguments, context snapshots scrubbed of credentials,
        input requests). Apps' data, like once-flows' results; never a key.
        """
        return f"{self.prefix}:tasks"

    @property
    def events(self) -> str:
        """The fleet's pub/sub channel of server events (:mod:`mcpfleet.notify`): list
        changes and resource updates, each a small JSON frame (its kind, a resource's
        URI, when it was published) that every replica reads and hands to its
        ``subscriptions/listen`` streams. A channel, not a key: nothing is stored."""
        return f"{self.prefix}:events"

    def sse(self, stream: str) -> str:
        """The stored events of one handshake-era SSE stream (:mod:`mcpfleet.notify`),
        named by a digest of the transport's stream id: a Redis stream of the
        JSON-RPC messages the owner sent on it, so a cut stream resumes with
        ``Last-Event-ID``. Bounded by count and age; expires after its last event.
        Apps' messages (tool results, notifications), never a key or a credential."""
        return f"{self.prefix}:sse:{stream}"

    def task_seals(self, kid: str) -> str:
        """The ledger of live MCP tasks whose stored snapshot key ``kid`` sealed
        (``--tasks-encrypt``, :mod:`mcpfleet.tasks`): a sorted set, one member per
        task (a hash of its scope and id, never the id), scored by the time (Unix
        seconds) its snapshot expires.

        A replica adds a task before it stores the snapshot, slides the score
        when the engine slides the snapshot's TTL, and removes it when the task
        ends (completed, failed, cancelled). A replica lost in between leaves an
        entry that counts until its score passes: too many, never too few. The
        operator counts the old kid's live members (ZCOUNT from now) before it
        retires that key. Under :attr:`tasks`, so the replica's queue selector
        covers it.
        """
        return task_seals_of(self.tasks_prefix, kid)

    @property
    def tasks_prefix(self) -> str:
        """What every key and channel of the task queue starts with (before ``:``): the
        queue's name, in braces on a cluster (the queue's library tags it so)."""
        return self._tag(self.tasks)

    def acl_rules(self, component: RedisComponent) -> list[str]:
        """The Redis ACL rules ``component`` needs in this fleet, and nothing more.

        For ``ACL SETUSER <user> on <password> <rules...>`` or a line of an
        ACL file. Each starts from nothing (``resetkeys``, ``resetchannels``,
        ``-@all``), then allows the keys and the commands the component
        really sends (every command below is sent by the code named beside
        it; a test runs each component under exactly these rules and checks
        ``ACL LOG`` stays empty):

        * ``replica`` (:class:`mcpfleet.registry.Publisher`): its
          attestation record and the registry set. The record's pattern covers
          every replica of the fleet, since pod names are not known in advance;
          pruning dead names (EXISTS on their records, SREM) needs that too.
          The once-ledger (:mod:`mcpfleet.once`): its entries, read and
          write (claim: SET NX GET PX; confirm and release: EVAL of GET,
          PTTL, SET, DEL; result: SET XX PX; a racing replay: GET; its memory
          watch and the version check at start: INFO). The routes of its own
          sessions, written back when Redis lost them (SET NX PX), and the
          ``lost`` marks of sessions its drain deadline cut (SET PX). The limits
          per principal (:mod:`mcpfleet.limits`): their buckets and holdings,
          through Lua scripts only (EVAL of TIME, GET, SET, ZADD, ZREM,
          ZREMRANGEBYSCORE, ZSCORE, ZCARD, ZRANGE, PEXPIRE). The MCP
          task queue (:mod:`mcpfleet.tasks`, FastMCP's tasks engine on a
          Docket): a selector (Redis 7) allowing the commands of
          :data:`TASK_QUEUE_COMMANDS` on the keys and channels under
          :attr:`tasks` only (and the workers' PSUBSCRIBE pattern of
          cancellations, which Redis matches as written); a fleet whose app
          has no tasks never sends them. The fleet's events
          (:mod:`mcpfleet.notify`): a selector allowing PUBLISH, SUBSCRIBE and
          UNSUBSCRIBE on the :attr:`events` channel only. The SSE event store
          (:mod:`mcpfleet.notify`): a selector allowing its Lua scripts (EVAL of
          XADD, XTRIM, PEXPIRE, TIME, XRANGE) on the :meth:`sse` keys only.
        * ``router`` (:mod:`mcpfleet.router.table`): the session keys,
          read and write (with ``--rehome-sessions`` also their ``init``,
          ``lost`` and ``moving`` records under the same pattern, with the
          same commands: MGET, GET, SET NX PX, PEXPIRE, DEL); the registry,
          read only; the version check at start: INFO.
        * ``operator`` (:mod:`mcpfleet_operator.runtime`): the registry and
          the attestations, read only; the task-seal ledgers
          (:meth:`task_seals`), read only, counted with ZCOUNT.

        PING is the client's health check; SELECT lets a URL name a database.
        AUTH and HELLO need no rule. On a Redis Cluster (``cluster``) every
        component also reads the slot map and the commands' key positions
        (CLUSTER SLOTS, COMMAND) and follows ASK redirections (ASKING); its key
        patterns are those of the tagged names (a session's ``{id}`` still
        matches ``session:*``).
        """
        records, registry = f"{self._fleet_slot}:replica:*", self.replicas
        base = ["resetkeys", "resetchannels", "-@all", "+ping", "+select"]
        if self.cluster:
            # A cluster client asks a node for the slot map (CLUSTER SLOTS) and
            # the commands' key positions (COMMAND, COMMAND GETKEYS), and sends
            # ASKING before a command redirected to a slot being imported.
            base += ["+cluster|slots", "+command", "+asking"]
        if component == "replica":
            keys = [
                f"~{registry}",
                f"~{records}",
                f"~{self.prefix}:once:*",
                f"~{self.prefix}:session:*",
            ]
            # publish: MULTI, SET (PX GET), SADD, EXEC (on a cluster: EVAL of SET and
            # SADD, one slot); prune: SMEMBERS, EXISTS, SREM;
            # withdraw at exit: DEL, SREM; once-ledger: SET (NX GET PX / XX PX), GET,
            # EVAL (GET, PTTL, SET, DEL), INFO; routes written back: SET NX PX.
            commands = [
                "multi",
                "exec",
                "set",
                "sadd",
                "smembers",
                "exists",
                "srem",
                "del",
                "get",
                "eval",
                "pttl",
                "info",
            ]
            # The limits per principal: a selector of their own, so their commands
            # (run by their Lua scripts) reach their keys only.
            limits = [f"(~{self.prefix}:limit:*", *(f"+{c}" for c in LIMIT_COMMANDS)]
            limits[-1] += ")"
            # The task queue: a selector of its own (Redis 7), so its commands
            # reach its keys and channels only, never the routes or the ledger.
            # PSUBSCRIBE needs its pattern allowed as written: the workers'
            # cancellation pattern is named too.
            queue = self.tasks_prefix
            selector = [f"(~{queue}:*", f"&{queue}:*", f"&{queue}:cancel:*"]
            selector += [f"+{c}" for c in TASK_QUEUE_COMMANDS]
            selector[-1] += ")"
            # The fleet's events: publish and read the one channel, nothing else.
            events = [f"(&{self.events}", "+publish", "+subscribe", "+unsubscribe)"]
            # The SSE event store: its two scripts, on its streams only.
            sse = [f"(~{self.sse('*')}", *(f"+{c}" for c in SSE_COMMANDS)]
            sse[-1] += ")"
            return [
                *base, *keys, *(f"+{c}" for c in commands), *selector, *limits, *events, *sse
            ]  # fmt: skip
        elif component == "router":
            keys = [f"~{self.prefix}:session:*", f"%R~{registry}", f"%R~{records}"]
            # registry: SMEMBERS, MGET; sessions: GET, SET (PX, NX), PEXPIRE, DEL;
            # the version check at start: INFO.
            commands = ["smembers", "mget", "get", "set", "pexpire", "del", "info"]
        elif component == "operator":
            keys = [f"%R~{registry}", f"%R~{records}", f"%R~{self.task_seals('*')}"]
            commands = ["smembers", "mget", "zcount"]
        else:
            raise ValueError(f"component must be one of {REDIS_COMPONENTS}, got {component!r}")
        return [*base, *keys, *(f"+{c}" for c in commands)]


#: What the limits per principal send (:mod:`mcpfleet.limits`), on their keys only:
#: EVAL of their scripts, and what the scripts call.
LIMIT_COMMANDS: tuple[str, ...] = (
    "eval", "time", "get", "set", "zadd", "zrem", "zremrangebyscore", "zscore", "zcard",
    "zrange", "pexpire",
)  # fmt: skip

#: What the SSE event store sends (:mod:`mcpfleet.notify._eventstore`), on its keys
#: only: EVAL of its two scripts, and what they call.
SSE_COMMANDS: tuple[str, ...] = ("eval", "xadd", "xtrim", "pexpire", "time", "xrange")

#: What the MCP task queue (pydocket, under FastMCP's tasks engine) sends, on
#: its own keys and channels only (:attr:`RedisKeys.tasks`): its streams
#: (XADD, XREAD, XREADGROUP, XAUTOCLAIM, XCLAIM, XACK, XDEL, XLEN, XGROUP, XPENDING),
#: scheduling and worker registry (sorted sets, sets, hashes), results and
#: the engine's task records (strings with TTLs), its Lua scripts (SCRIPT
#: LOAD and EXISTS, never FLUSH; EVALSHA), cancellation and progress (PUBLISH, SUBSCRIBE);
#: WAIT, with which a creation through Sentinel waits for a replica to hold it;
#: TIME, the clock of the tasks limit's scripts (:mod:`mcpfleet.tasks._limits`).
TASK_QUEUE_COMMANDS: tuple[str, ...] = (
    "xadd", "xread", "xreadgroup", "xautoclaim", "xclaim", "xack", "xdel", "xlen", "xgroup",
    "xpending", "xinfo", "xrange",
    "zadd", "zcard", "zcount", "zrem", "zremrangebyscore", "zrange", "zrangebyscore", "zscore",
    "sadd", "smembers", "srem", "scard", "sismember",
    "hset", "hget", "hgetall", "hdel", "hexists", "hincrby", "hmget",
    "set", "setex", "get", "mget", "exists", "expire", "pexpire", "ttl", "pttl", "del",
    "unlink", "incr",
    "multi", "exec", "eval", "evalsha", "script|load",
    "script|exists",
    "publish", "subscribe", "unsubscribe", "psubscribe", "punsubscribe",
    "info", "wait", "time",
)  # fmt: skip

#: The components that connect to Redis, each under its own ACL user.
RedisComponent = Literal["replica", "router", "operator"]
REDIS_COMPONENTS: tuple[RedisComponent, ...] = ("replica", "router", "operator")


# --- Attestation ------------------------------------------------------------------

ReplicaState = Literal["serving", "draining"]
REPLICA_STATES: tuple[ReplicaState, ...] = ("serving", "draining")

#: Default heartbeat period and record TTL, in seconds. A replica that stops
#: heart-beating disappears from the registry after the TTL.
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TTL = 3.0


@dataclass(frozen=True)
class Attestation:
    """What a replica publishes about itself under :meth:`RedisKeys.replica`.

    ``kids`` is the ordered list of key ids of the ring the replica has LOADED
    (first seals), not merely what is on disk: the operator advances a rotation
    only when every replica attests the ring it needs.

    The counts are what the replica holds right now, the load a scale-in would
    cut (the operator turns them into the pod's deletion cost,
    ``mcpfleet_operator.deletioncost``): ``sessions`` live handshake sessions,
    ``inflight`` requests in flight, ``paused`` handshake-era asks
    (``elicitation/create``, sampling, roots) waiting for the client's answer,
    ``listens`` open ``subscriptions/listen`` streams, ``tasks`` MCP tasks its
    worker runs. Counts only: never a session, task or stream id. A record
    written before a count existed reads it as 0.
    """

    name: str
    address: str
    state: ReplicaState
    kids: tuple[str, ...]
    heartbeat: float
    sessions: int = 0
    inflight: int = 0
    started: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    paused: int = 0
    listens: int = 0
    tasks: int = 0

    def to_json(self) -> str:
        data = asdict(self)
        data["kids"] = list(self.kids)
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Attestation:
        """Parse a record; raise ValueError on anything malformed."""
        try:
            data: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"attestation is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("attestation is not a JSON object")
        try:
            name, address, state = data["name"], data["address"], data["state"]
            kids, heartbeat = data["kids"], data["heartbeat"]
        except KeyError as exc:
            raise ValueError(f"attestation lacks {exc.args[0]!r}") from None
        if not (isinstance(name, str) and isinstance(address, str)):
            raise ValueError("attestation name/address must be strings")
        if state not in REPLICA_STATES:
            raise ValueError(f"attestation state {state!r} is not one of {REPLICA_STATES}")
        if not (isinstance(kids, list) and all(isinstance(k, str) for k in kids)):
            raise ValueError("attestation kids must be a list of strings")
        if not isinstance(heartbeat, int | float) or not math.isfinite(heartbeat):
            raise ValueError("attestation heartbeat must be a number")
        labels = data.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError("attestation labels must be an object")
        return cls(
            name=name,
            address=address,
            state=state,
            kids=tuple(kids),
            heartbeat=float(heartbeat),
            sessions=int(data.get("sessions", 0)),
            inflight=int(data.get("inflight", 0)),
            started=float(data.get("started", 0.0)),
            labels={str(k): str(v) for k, v in labels.items()},
            paused=_count(data, "paused"),
            listens=_count(data, "listens"),
            tasks=_count(data, "tasks"),
        )


def _count(data: dict[str, Any], key: str) -> int:
    """A count of an attestation: a non-negative integer, 0 when absent."""
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"attestation {key} must be a non-negative integer")
    return value


# --- Kubernetes -------------------------------------------------------------------

LABEL_PREFIX = "mcpfleet.dev"
#: Label on replica pods naming the KeyRing they consume.
KEYRING_LABEL = f"{LABEL_PREFIX}/keyring"
#: Label naming the mcpfleet component of a pod (server, router, operator).
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Pod annotation the operator bumps after writing the Secret, so the kubelet
#: refreshes the volume now rather than after its sync period.
KEYRING_NUDGE_ANNOTATION = f"{LABEL_PREFIX}/keyring-generation"
