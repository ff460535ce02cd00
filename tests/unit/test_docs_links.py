"""The README is the front door: every page of docs/ is linked from it, and every
relative link of the README and of docs/ leads to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")


def links(markdown: str) -> list[str]:
    """The link targets of ``markdown``, outside code blocks and code spans."""
    return LINK.findall(CODE.sub("", FENCE.sub("", markdown)))


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.MULTILINE)
    return {anchor(h) for h in headings}


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or heading does not exist."""
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        missing_heading = (
            dest.is_file()
            and dest.suffix == ".md"
            and fragment not in {"", *anchors(dest.read_text())}
        )
        if not dest.exists() or missing_heading:
            broken.append(target)
    return broken


def test_there_are_docs_to_link() -> None:
    assert len(DOCS) >= 8, DOCS


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_doc_is_linked_from_the_readme(doc: Path) -> None:
    targets = {t.partition("#")[0] for t in links(README.read_text())}
    assert f"docs/{doc.name}" in targets, f"README.md does not link docs/{doc.name}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: broken links"


def test_a_broken_link_or_heading_is_seen(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## What `make test` does, and costs\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#what-make-test-does-and-costs) [ok](#page)\n"
        "[web](https://example.com/x) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [no heading](other.md#nowhere) [here](#nowhere)\n"
    )
    assert broken_links(page) == ["missing.md", "other.md#nowhere", "#nowhere"]
