"""A fix put in front of one of FastMCP's own methods, and only of FastMCP's own.

The replica's fixes of work FastMCP repeats on every round (``toollookup``,
``roundparams``) replace a method of a FastMCP class with a wrapper around it.
:func:`put_in_front` does it once: the wrapper keeps the method as
``__wrapped__`` (which is how :func:`in_front` tells it is there), its
``__qualname__`` and its docstring; a method that is not FastMCP's own any more
(another FastMCP, or something else replaced it) is left alone, and one line
says what the replica does without the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import fastmcp

__all__ = ["in_front", "put_in_front"]

log = logging.getLogger("mcpfleet.replica")


def in_front(owner: type[Any], name: str) -> bool:
    """Whether a fix is in front of ``owner.name``."""
    return hasattr(owner.__dict__.get(name), "__wrapped__")


def put_in_front(
    owner: type[Any],
    name: str,
    fix: Callable[[Callable[..., Any]], Callable[..., Any]],
    without: str,
    *,
    needs: tuple[str, ...] = (),
) -> bool:
    """Put ``fix(method)`` in front of ``owner.name``; True if a fix is there.

    Idempotent. Only FastMCP's own method is wrapped (its qualified name and
    module are ``owner``'s), and only while ``owner`` has the attributes the fix
    calls (``needs``); otherwise a warning ends with ``without``.
    """
    if in_front(owner, name):
        return True
    current = owner.__dict__.get(name)
    if (
        current is None
        or getattr(current, "__qualname__", None) != f"{owner.__name__}.{name}"
        or getattr(current, "__module__", None) != owner.__module__
        or not all(hasattr(owner, attr) for attr in needs)
    ):
        log.warning(
            "fastmcp %s: %s.%s is not FastMCP's own; %s",
            fastmcp.__version__,
            owner.__name__,
            name,
            without,
        )
        return False
    wrapper = fix(current)
    wrapper.__wrapped__ = current  # type: ignore[attr-defined]
    wrapper.__qualname__ = current.__qualname__
    wrapper.__doc__ = current.__doc__
    setattr(owner, name, wrapper)
    return True
