"""The version is written once (pyproject.toml); every other place reads it or equals it."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

import mcpfleet

ROOT = Path(__file__).resolve().parents[2]


def _written_version() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert isinstance(version, str) and re.fullmatch(r"\d+\.\d+\.\d+\S*", version), version
    return version


def test_the_package_reports_the_version_pyproject_declares() -> None:
    assert mcpfleet.__version__ == _written_version()


def test_the_charts_app_version_equals_it() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "mcpfleet" / "Chart.yaml").read_text())
    assert chart["appVersion"] == _written_version()


def test_the_image_build_reads_it_and_the_dockerfiles_write_none() -> None:
    version = _written_version()
    for dockerfile in (ROOT / "Dockerfile", ROOT / "hack" / "image" / "redis.Dockerfile"):
        text = dockerfile.read_text()
        assert re.search(r"^ARG VERSION$", text, re.M), f"{dockerfile}: ARG VERSION, no default"
        assert version not in text, f"{dockerfile} writes the version itself"
    build = (ROOT / "hack" / "image" / "build.sh").read_text()
    (line,) = [ln for ln in build.splitlines() if ln.startswith('version="$(')]
    out = subprocess.run(
        ["bash", "-c", f'{line}\nprintf %s "$version"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert out.stdout == version
