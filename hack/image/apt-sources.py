#!/usr/bin/env python3
"""Print the Debian mirror lines this machine's apt already uses, for mmdebstrap.

    python3 hack/image/apt-sources.py bookworm

Reads /etc/apt/sources.list and /etc/apt/sources.list.d/*.list (one-line form)
and *.sources (deb822 form), keeps the ``deb`` entries of SUITE and its
``-updates``/``-security`` suites with the ``main`` component, and prints one
``deb URI SUITE main`` line per entry. Repositories of other vendors (a cloud
SDK, nodesource, ...) are left out because their suites are not Debian's.
No mirror host is ever written into the repository: the base image comes from
whatever mirror the machine is configured with.
"""

from __future__ import annotations

import sys
from pathlib import Path

APT = Path("/etc/apt")


def one_line_entries(text: str) -> list[tuple[str, str, list[str]]]:
    """(uri, suite, components) of each ``deb`` line of a sources.list file."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        words = line.split()[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words.pop(0)
            words = words[1:]
        if len(words) >= 3:
            out.append((words[0], words[1], words[2:]))
    return out


def deb822_entries(text: str) -> list[tuple[str, str, list[str]]]:
    """(uri, suite, components) of each ``Types: deb`` stanza of a .sources file."""
    out = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled") == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                out.append((uri, suite, fields.get("components", "").split()))
    return out


def mirror_lines(suite: str) -> list[str]:
    files = [APT / "sources.list", *sorted((APT / "sources.list.d").glob("*"))]
    entries = []
    for path in files:
        if not path.is_file():
            continue
        if path.suffix == ".sources":
            entries += deb822_entries(path.read_text())
        elif path.suffix == ".list" or path.name == "sources.list":
            entries += one_line_entries(path.read_text())
    wanted = {suite, f"{suite}-updates", f"{suite}-security", f"{suite}/updates"}
    lines = []
    for uri, entry_suite, components in entries:
        if entry_suite in wanted and "main" in components:
            line = f"deb {uri} {entry_suite} main"
            if line not in lines:
                lines.append(line)
    return lines


def main() -> int:
    suite = sys.argv[1] if len(sys.argv) > 1 else "bookworm"
    lines = mirror_lines(suite)
    if not lines:
        print(f"apt-sources: no Debian {suite} mirror in {APT}/sources.list*", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
