"""A request's multi-round-trip fields parsed once, not once per read.

A FastMCP ``Context`` reads a round's ``input_responses`` and ``request_state``
(SEP-2322) by parsing the request's raw params again at each read
(``Context._input_response_params``: ``InputResponseRequestParams.model_validate``
of a copy of them). A ``tools/call`` reads them at least twice in FastMCP (the
middleware's view of the call), and a guard tool reads them again: four parses
on an answer round (``tests/unit/test_roundparams.py`` counts them), whose
``inputResponses`` are the dearest part to validate.

:func:`parse_round_params_once` puts a memo in front of that method: the parse
of a request's params is kept while the same params (the same mapping, holding
the same ``requestState`` and ``inputResponses`` values) are read again, for
the :data:`MEMO_SIZE` requests read last. It is FastMCP's own parse, called as
before on a miss; a parse that fails is not kept (it fails again at each read,
as before).

What differs: every reader of one request's fields gets the same parsed
object, where FastMCP gave each its own copy. A middleware that changed, in
place, the input responses it is shown (``context.message.input_responses``)
would change what the tool reads; FastMCP's docs give those fields to
middleware to look at.

This is private structure, so it runs only on the FastMCP versions the replica
is tested on (:data:`mcpfleet.replica.appload.TESTED_FASTMCP`, which the replica
checks before it serves), and only while the method is still FastMCP's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final

from fastmcp.server.context import Context

from mcpfleet.replica.infront import in_front, put_in_front

__all__ = ["MEMO_SIZE", "parse_round_params_once", "round_params_parsed_once"]

#: Requests whose parsed fields are kept at once (a request's reads may interleave
#: with other requests' at each ``await`` between them).
MEMO_SIZE: Final = 32
_METHOD: Final = "_input_response_params"


def _memoized(original: Callable[[Context], Any]) -> Callable[[Context], Any]:
    # id(params) -> (params, its requestState, its inputResponses, the parse). The
    # entry holds ``params`` itself, so its id is not reused while it is kept.
    memo: dict[int, tuple[Any, Any, Any, Any]] = {}

    def _input_response_params(self: Context) -> Any:
        rc = self.request_context
        params = None if rc is None else getattr(rc._srctx, "params", None)
        if type(params) is not dict:
            return original(self)
        state, responses = params.get("requestState"), params.get("inputResponses")
        key = id(params)
        held = memo.get(key)
        if held is not None and held[0] is params and held[1] is state and held[2] is responses:
            return held[3]
        parsed = original(self)
        if len(memo) >= MEMO_SIZE:
            # A sync tool's thread may have read meanwhile: the oldest is then gone.
            with contextlib.suppress(RuntimeError, StopIteration):
                memo.pop(next(iter(memo)), None)
        memo[key] = (params, state, responses, parsed)
        return parsed

    return _input_response_params


def round_params_parsed_once() -> bool:
    """Whether the memo is in front of ``Context._input_response_params``."""
    return in_front(Context, _METHOD)


def parse_round_params_once() -> bool:
    """Put the memo in front of FastMCP's parse of a round's fields; True if it is there.

    Idempotent. A method that is not FastMCP's own any more (another FastMCP, or
    something else replaced it) is left alone, and one line says so.
    """
    return put_in_front(Context, _METHOD, _memoized, "a round's fields are parsed at each read")
