"""Checks shared by the tests of mcpfleet's fixes in front of FastMCP's own methods."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest


def assert_left_alone(
    owner: type[Any],
    name: str,
    install: Callable[[], bool],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``install`` leaves ``owner.name`` alone once it is not FastMCP's own, and says so."""

    def someone_elses(*args: Any, **kwargs: Any) -> Any:
        return None

    monkeypatch.setattr(owner, name, someone_elses)
    with caplog.at_level(logging.WARNING, logger="mcpfleet.replica"):
        assert not install()
    assert owner.__dict__[name] is someone_elses
    assert "is not FastMCP's own" in caplog.text
