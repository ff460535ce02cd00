"""The tracked files describe mcpfleet, not how it was made.

A reader of the docs, the code or the tests cannot look up a development
round, a work session, a tracker's issue number or who did what: a page names
the behaviour instead (what is true now, and the command that shows it), and
history stays in git and in CHANGELOG.md. This test reads every tracked text
file and fails naming each ``file:line`` that refers to the development
process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: A unit after the number: "stop" is then the ordinary verb ("stops 2 s later").
_UNIT = (
    r"(?:s|ms|us|sec|secs|seconds?|min|mins|minutes?|h|hours?|times|of|replicas?|routers?"
    r"|workers?|nodes?|pods?|containers?|process(?:es)?|sessions?|requests?|tasks?)"
)
#: "this session" in the sense of a work session: when it happened, or what it had.
#: An MCP session of the product ("every request of this session", "this session's
#: owner") is not that.
_WORK_SESSION = (
    r"\b(?:in|during|since|before|after|until) this session\b(?!['\u2019]s)"
    r"|\bthis session['\u2019]s (?:machine|work|runs?|additions?|changes?|branch|commits?"
    r"|figures?|measurements?)\b"
)

#: Each pattern, with what to write instead.
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(rf"\bstops? \d+\b(?![\d.,]*\s*{_UNIT}\b)", re.IGNORECASE),
        "a development round: name the behaviour or the command that shows it",
    ),
    (
        re.compile(_WORK_SESSION, re.IGNORECASE),
        "a work session: say what is true now",
    ),
    (
        re.compile(r"\bissues? #?\d+\b", re.IGNORECASE),
        "an issue number no reader can look up: name the behaviour",
    ),
    (
        re.compile(
            r"\b(?:a|the|another|each|one|this|that|every|other)\s+helper(?:['\u2019]s\b|s['\u2019])",
            re.IGNORECASE,
        ),
        "who did the work: name the code or the behaviour",
    ),
]

#: Generated or vendored files whose text is not the project's prose.
_GENERATED = re.compile(r"(?:^|/)(?:package-lock\.json|go\.sum|go\.mod)$|^hack/lock/")


def process_wording(text: str) -> list[tuple[int, str, str]]:
    """``(line number, matched text, what to do)`` for each reference to the process."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, advice in PATTERNS:
            for match in pattern.finditer(line):
                hits.append((number, match.group(0), advice))
    return hits


def tracked_files() -> list[Path]:
    """Every text file git tracks, less generated ones."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    out = subprocess.run(
        [git, "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name and not _GENERATED.search(name)]


def test_no_tracked_file_refers_to_how_the_project_was_made() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, not yet in the index
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for number, what, advice in process_wording(text):
            found.append(f"{path.relative_to(ROOT)}:{number}: {what!r}: {advice}")
    assert not found, "process wording in tracked files:\n" + "\n".join(found)


# The samples are built from parts so that this file holds none of them whole.
STOP, SESSION, ISSUE, HELPER = "stop", "session", "issue", "helper"


@pytest.mark.parametrize(
    "line",
    [
        f"What a run costs, as measured in {STOP} 26 (the latest).",
        f"Where each target stands ({STOP} 35)",
        f"the landed CI of {STOP} 25's work",
        f"This {SESSION}'s machine was a new one.",
        f"measured in this {SESSION}, on 2 cores",
        f"The targets ({ISSUE} 26), PASS / FAIL",
        f"{ISSUE.title()} 12's scale targets",
        f"MCP tasks ({ISSUE}s 28 and 29)",
        f"as the {HELPER}'s report says",
        f"the other {HELPER}s' branches",
    ],
)
def test_process_wording_is_seen(line: str) -> None:
    assert process_wording(line), line


@pytest.mark.parametrize(
    "line",
    [
        f"SIGTERM: {STOP} 3 replicas, then the router",
        f"the kubelet {STOP}s 2 s later",
        f"{STOP} 2.5 s after the last request",
        f"every request of this {SESSION} goes to its owner",
        f"this {SESSION}'s owner is gone: the 404",
        f"a CA that can {ISSUE} client certificates",
        f"{ISSUE}d 3 tokens; the {ISSUE}r claim",
        f"the wait {HELPER} polls with a bound",
        f"test {HELPER}s live in hack/devkit",
    ],
)
def test_product_wording_is_not_flagged(line: str) -> None:
    assert not process_wording(line), line
