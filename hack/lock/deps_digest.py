#!/usr/bin/env python3
"""Print the sha256 of pyproject.toml's dependency tables, as the locks record it.

Only what decides the locked set counts: ``requires-python``,
``dependencies`` and ``optional-dependencies`` (canonical JSON), so editing a
comment or the version does not make the locks stale.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def deps_digest(pyproject: Path = PYPROJECT) -> str:
    project = tomllib.loads(pyproject.read_text())["project"]
    tables = {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
    }
    canonical = json.dumps(tables, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


if __name__ == "__main__":
    print(deps_digest(Path(sys.argv[1]) if len(sys.argv) > 1 else PYPROJECT))
