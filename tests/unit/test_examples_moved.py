"""The example apps left the mcpfleet package: their 0.1.0 names keep working.

0.1.0's default app, ``mcpfleet.example.app:app``, is in users' values files
(the chart's ``server.app``): a replica given it serves ``mcpfleet_examples.app``
and says so once, and its default request-state audience is the one a replica
given the new name has, so a rollout from one spelling to the other loses no
asking round.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

import mcpfleet_examples.app
import mcpfleet_examples.conformance
from mcpfleet.config import (
    DEFAULT_APP,
    ReplicaConfig,
    first_app_name,
    moved_app_module,
)
from mcpfleet.replica.appload import AppLoadError, load_app


def test_the_default_app_is_the_example_app_beside_mcpfleet() -> None:
    assert DEFAULT_APP == "mcpfleet_examples.app:app"
    assert load_app(DEFAULT_APP) is mcpfleet_examples.app.app


@pytest.mark.parametrize(
    ("old", "app"),
    [
        ("mcpfleet.example.app:app", mcpfleet_examples.app.app),
        ("mcpfleet.example.conformance:app", mcpfleet_examples.conformance.app),
    ],
)
def test_an_example_app_under_its_0_1_0_name_loads_with_one_line_saying_it_moved(
    old: str, app: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="mcpfleet.replica"):
        assert load_app(old) is app
    (record,) = [r for r in caplog.records if r.name == "mcpfleet.replica"]
    assert record.levelno == logging.WARNING
    new = old.replace("mcpfleet.example.", "mcpfleet_examples.")
    assert f"moved to {new.partition(':')[0]}" in record.getMessage()
    assert f"serving {new}" in record.getMessage()


def test_an_app_that_never_moved_loads_without_a_word(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mcpfleet.replica"):
        load_app(DEFAULT_APP)
    assert not [r for r in caplog.records if r.name == "mcpfleet.replica"]


@pytest.mark.parametrize(
    ("module", "now"),
    [
        ("mcpfleet.example", "mcpfleet_examples"),
        ("mcpfleet.example.app", "mcpfleet_examples.app"),
        ("mcpfleet.examples", None),
        ("mcpfleet.example_app", None),
        ("mcpfleet_examples.app", None),
        ("ownapp.server", None),
    ],
)
def test_only_the_modules_that_moved_are_renamed(module: str, now: str | None) -> None:
    assert moved_app_module(module) == now


@pytest.mark.parametrize(
    "app", ["mcpfleet.example.app:app", "mcpfleet_examples.app:app", DEFAULT_APP]
)
def test_both_names_of_the_example_app_make_one_default_audience(app: str) -> None:
    config = ReplicaConfig(keys_dir=Path("/k"), app=app)
    assert config.resolved_audience() == "mcpfleet/mcpfleet.example.app:app"
    assert first_app_name(app) == "mcpfleet.example.app:app"


def test_any_other_app_keeps_its_audience_and_the_flag_wins() -> None:
    assert ReplicaConfig(keys_dir=Path("/k"), app="own.server:mcp").resolved_audience() == (
        "mcpfleet/own.server:mcp"
    )
    explicit = ReplicaConfig(keys_dir=Path("/k"), app=DEFAULT_APP, audience="shop")
    assert explicit.resolved_audience() == "shop"


def test_without_the_examples_distribution_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "mcpfleet_examples"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcpfleet_examples", None)  # import raises
    with pytest.raises(AppLoadError, match="mcpfleet-examples") as raised:
        load_app(DEFAULT_APP)
    assert "cannot import module 'mcpfleet_examples" in str(raised.value)
    assert "pip install ./server" in str(raised.value)


def test_a_missing_module_of_ones_own_gets_no_hint_about_the_examples() -> None:
    with pytest.raises(AppLoadError) as raised:
        load_app("mcpfleet_examples.nosuch:app")
    assert "mcpfleet-examples" not in str(raised.value)
