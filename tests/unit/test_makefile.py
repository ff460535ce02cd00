"""`make help` lists every target: each .PHONY target has a `## ` description on its line."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"


def phony_targets(makefile: str) -> list[str]:
    return [
        t for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.MULTILINE) for t in line.split()
    ]


def described_targets(makefile: str) -> dict[str, str]:
    """Targets whose rule line carries ``## <description>``, as `make help` reads them."""
    return dict(re.findall(r"^([a-zA-Z0-9_-]+):.*?## (.+)$", makefile, re.MULTILINE))


def undescribed(makefile: str) -> list[str]:
    described = described_targets(makefile)
    return [t for t in phony_targets(makefile) if not described.get(t, "").strip()]


def test_every_phony_target_has_a_description() -> None:
    makefile = MAKEFILE.read_text()
    assert len(phony_targets(makefile)) >= 30
    assert not undescribed(makefile), "add `## <what it does>` to their rule lines"


def test_every_described_target_is_phony() -> None:
    makefile = MAKEFILE.read_text()
    extra = set(described_targets(makefile)) - set(phony_targets(makefile))
    assert not extra, f"described targets missing from .PHONY: {sorted(extra)}"


def test_a_target_without_a_description_is_seen() -> None:
    makefile = ".PHONY: a b\na: ## does a\n\ttrue\nb: a\n\ttrue\n"
    assert undescribed(makefile) == ["b"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_help_lists_every_phony_target_with_its_description() -> None:
    out = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    listed = dict(re.findall(r"^  (\S+) +(.+)$", out, re.MULTILINE))
    makefile = MAKEFILE.read_text()
    assert listed == {t: described_targets(makefile)[t] for t in phony_targets(makefile)}
