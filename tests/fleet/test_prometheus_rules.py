"""promtool (Debian's prometheus package) checks and unit-tests the alert rules."""

from __future__ import annotations

import subprocess

from fleetkit import monitoring


def test_promtool_check_rules_accepts_the_rules_file() -> None:
    promtool = monitoring.require_binary("promtool")
    out = subprocess.run(
        [promtool, "check", "rules", str(monitoring.RULES_FILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(monitoring.alerts())} rules found" in out.stdout


def test_promtool_unit_tests_fire_and_stay_quiet_as_written() -> None:
    promtool = monitoring.require_binary("promtool")
    files = sorted(p.name for p in monitoring.RULE_TESTS.glob("*.test.yaml"))
    assert files
    out = subprocess.run(
        [promtool, "test", "rules", *files],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=monitoring.RULE_TESTS,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
