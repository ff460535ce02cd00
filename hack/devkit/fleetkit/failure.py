"""What the tiers' fixtures print when a test fails: one check, one printer.

The root conftest keeps each phase's report on the test item (``rep_call``);
:func:`call_failed` reads it, and :func:`explain_on_failure` prints what each
explainer returns, after the test body and before its fixtures tear down
what the explanation reads (log files, Redis, the cluster).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


def call_failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test's own body (not its set-up or teardown) failed."""
    report = getattr(request.node, "rep_call", None)
    return bool(report is not None and report.failed)


def explain_on_failure(request: pytest.FixtureRequest, *explainers: Callable[[], str]) -> None:
    """Print each explainer's text if the test failed (call it after the test's ``yield``)."""
    if call_failed(request):
        for explain in explainers:
            print(explain())
