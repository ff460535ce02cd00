"""A principal's share of the fleet's workers: pydocket's ``ConcurrencyLimit``, keyed by principal.

The engine registers each task tool with the queue as a wrapper around its
function, and pydocket resolves a registered function's dependencies from its
signature (``__signature__`` when set, as the engine's wrapper sets it). The
fleet's wrapper (:func:`mcpfleet.tasks._engine_hooks._replace_reentrant_task_fn`)
declares one more keyword parameter, :data:`SHARE_PARAM`, whose default is a
:class:`PrincipalShare`: a ``ConcurrencyLimit`` that, for each execution,
finds the task's principal and its share (``Count.running`` of the rules in
force), and enters pydocket's own ``ConcurrencyLimit`` grouped by that
principal (its per-argument form: the argument is the parameter itself, whose
value reads as the principal of the execution being admitted). A task past its
principal's share is parked by pydocket on a waiter stream, taking no worker,
and woken when one of that principal's tasks ends; a worker lost mid-task
gives its slot back when its lease goes stale (the redelivery timeout). The
wrapper drops the parameter before the tool is called: the tool never sees it.

A tool that declares a ``ConcurrencyLimit`` of its own keeps it and gets no
share (pydocket allows one per task).
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Final

from mcpfleet.tasks._limits import SHARED

#: The keyword parameter the fleet adds to each task tool's registered wrapper.
SHARE_PARAM: Final = "_mcpfleet_share"
#: The sub-namespace of the shares' keys under the queue's prefix:
#: ``<tasks>:mcpfleet-share:concurrency:_mcpfleet_share:<principal>``.
SHARE_SCOPE: Final = "mcpfleet-share"

#: The principal of the execution being admitted (what the parameter's value reads as).
_ADMITTING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcpfleet_share_principal", default=None
)


def with_share(signature: inspect.Signature, share: Any) -> inspect.Signature | None:
    """``signature`` with :data:`SHARE_PARAM` (keyword-only, default ``share``) added, or
    None when a parameter already has that name."""
    params = list(signature.parameters.values())
    if SHARE_PARAM in signature.parameters:
        return None
    added = inspect.Parameter(SHARE_PARAM, inspect.Parameter.KEYWORD_ONLY, default=share)
    at = next(
        (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params)
    )
    return signature.replace(parameters=[*params[:at], added, *params[at:]])


def declares_concurrency(fn: Callable[..., Any]) -> bool:
    """Whether pydocket finds a ``ConcurrencyLimit`` among ``fn``'s own dependencies."""
    dependencies: Any = importlib.import_module("docket.dependencies")
    introspect: Any = importlib.import_module("uncalled_for")
    found = list(introspect.get_dependency_parameters(fn).values())
    for deps in introspect.get_annotation_dependencies(fn).values():
        found += list(deps)
    return any(isinstance(d, dependencies.ConcurrencyLimit) for d in found)


#: Finds a principal's share for an execution: (docket, execution key) -> (principal, share).
ShareOf = Callable[[Any, str], Any]

_CLASS: list[type[Any]] = []


def principal_share(share_of: Callable[[], ShareOf | None]) -> Any:
    """A :class:`PrincipalShare` reading ``share_of()`` at each execution (None: no share)."""
    if not _CLASS:
        _CLASS.append(_define())
    return _CLASS[0](share_of)


def _define() -> type[Any]:
    dependencies: Any = importlib.import_module("docket.dependencies")
    ConcurrencyLimit: Any = dependencies.ConcurrencyLimit
    current_docket, current_execution = dependencies.current_docket, dependencies.current_execution

    class PrincipalShare(ConcurrencyLimit):  # type: ignore[misc]  # pydocket's, looked up at run time
        """``ConcurrencyLimit`` per principal, its slots the principal's ``running``.

        A subclass so that pydocket enters ``ConcurrencyLimit``'s worker lifecycle
        (its safeguard task and cancel subscriber) for the tools that carry it.
        """

        def __init__(self, share_of: Callable[[], ShareOf | None]) -> None:
            super().__init__(max_concurrent=1)
            self._share_of = share_of

        def __str__(self) -> str:
            # The value of the parameter, as the per-argument key reads it.
            return _ADMITTING.get() or SHARED

        async def __aenter__(self) -> Any:
            share_of = self._share_of()
            if share_of is None:
                return self
            principal, slots = await share_of(current_docket.get(), current_execution.get().key)
            if slots <= 0:
                return self
            token = _ADMITTING.set(principal)
            try:
                limit = ConcurrencyLimit(SHARE_PARAM, slots, scope=SHARE_SCOPE)
                return await limit.__aenter__()
            finally:
                _ADMITTING.reset(token)

    return PrincipalShare
