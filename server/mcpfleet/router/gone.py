"""A session whose owner is gone: why the owner counts as gone, and why it was not moved.

:class:`OwnerGone` says how the router noticed the owner's absence,
:class:`Lost` why a session was ended rather than re-homed (work of it was in
flight: :func:`answers_gone_work` tells one such request). Both label the
router's metrics; the 404 that ends such a session is
:class:`~mcpfleet.router.move.SessionEnd`'s.
"""

from __future__ import annotations

import enum
import json

from mcpfleet.contract import LOST_AT_DRAIN_DEADLINE


class OwnerGone(enum.StrEnum):
    """Why a session's owner counts as gone: the ``reason`` of ``owner_gone_total``
    (and the ``cause`` of ``sessions_rehomed_total``)."""

    DEREGISTERED = "deregistered"  # known dead, or absent from the registry too long
    REFUSED = "refused"  # its address refused the connection
    UNKNOWN_TO_OWNER = "unknown_to_owner"  # it answered that it no longer has the session
    DIED = "died"  # it dropped a request mid-way and then refused connections


class Lost(enum.StrEnum):
    """Why a session whose owner went was ended with the 404 instead of re-homed:
    the ``reason`` of ``mcpfleet_router_sessions_lost_total``."""

    #: This router had a request of the session in flight on the gone owner.
    IN_FLIGHT = "in_flight"
    #: A router's forwarded request of the session broke when the owner went
    #: (marked in Redis before that router answered).
    REQUEST_BROKE = "request_broke"
    #: The request answers (or cancels) a request of the gone owner: an
    #: elicitation's answer, a ``notifications/cancelled``.
    ANSWER_ORPHANED = "answer_orphaned"
    #: The live replica refused to open the session again (not a credential's 401/403).
    REFUSED = "refused"
    #: Its replica's drain deadline cut a request of the session (the replica
    #: marked it in Redis before it stopped, whatever the router saw of the end).
    DRAIN_DEADLINE = LOST_AT_DRAIN_DEADLINE


def answers_gone_work(body: bytes) -> bool:
    """Whether a POST body answers or cancels something the gone owner asked or ran:
    a JSON-RPC response (an elicitation's answer) or ``notifications/cancelled``.
    Such a session had work in flight: it is not re-homed."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    items = doc if isinstance(doc, list) else [doc]
    for item in items:
        if not isinstance(item, dict):
            continue
        if "method" not in item and ("result" in item or "error" in item):
            return True
        if item.get("method") == "notifications/cancelled":
            return True
    return False
