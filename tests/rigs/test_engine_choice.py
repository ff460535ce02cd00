"""Docker or podman is chosen by what answers, never by what is on the PATH.

A machine of this project's kind ships a ``docker`` command with no engine
behind it: there, the kind group of hack/ensure-debs.sh must install podman and
the dnsname CNI plugin, and the kind provider must pick podman. Stubs on a
PATH of their own stand in for docker, podman and dpkg.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleetkit.cluster import kind

ROOT = Path(__file__).resolve().parents[2]
ENSURE_DEBS = ROOT / "hack" / "ensure-debs.sh"


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _machine(tmp_path: Path, *, docker: str | None, podman: bool) -> Path:
    """A PATH holding only stubs: ``docker`` whose ``info`` exits ``docker`` ('ok'/'fails'),
    ``podman`` if ``podman``; dpkg knows no package installed (podman only removed,
    its config files left, as ``apt-get remove`` leaves it), and every other command the
    script looks for is missing (but ``dirname``, which it uses to find its library)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if docker is not None:
        code = 0 if docker == "ok" else 1
        _stub(bin_dir, "docker", f'[ "$1" = info ] && exit {code}; exit 0')
    if podman:
        _stub(bin_dir, "podman", "exit 0")
    # dpkg knows podman only as removed, not purged (its config files are left).
    _stub(
        bin_dir,
        "dpkg-query",
        '[ "$4" = podman ] && { printf "deinstall ok config-files"; exit 0; }; exit 1',
    )
    # ...while `dpkg -s podman` succeeds for it, as the real one does.
    _stub(bin_dir, "dpkg", '[ "$1" = -s ] && [ "$2" = podman ] && exit 0; exit 1')
    _stub(bin_dir, "grep", 'exec /bin/grep "$@"')
    _stub(bin_dir, "id", "echo 0")
    # coreutils' timeout, as the engine probe uses it: drop the duration, run the rest.
    _stub(bin_dir, "timeout", 'shift; exec "$@"')
    (bin_dir / "dirname").symlink_to("/usr/bin/dirname")
    return bin_dir


def _would_install(bin_dir: Path, *groups: str) -> list[str]:
    done = subprocess.run(
        ["/bin/bash", str(ENSURE_DEBS), *groups],
        env={
            "PATH": str(bin_dir),
            "MCPFLEET_DEBS_DRY_RUN": "1",
            # No CNI plugin installed either (this machine may have them).
            "MCPFLEET_CNI_PLUGIN_DIR": str(bin_dir / "no-cni"),
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("would install:")]
    return line.split(":", 1)[1].split()


def test_a_docker_client_without_an_engine_still_gets_podman_and_dnsname(
    tmp_path: Path,
) -> None:
    packages = _would_install(_machine(tmp_path, docker="fails", podman=False), "kind")
    assert "podman" in packages
    assert "golang-github-containernetworking-plugin-dnsname" in packages


def test_a_docker_engine_that_answers_needs_no_podman(tmp_path: Path) -> None:
    packages = _would_install(_machine(tmp_path, docker="ok", podman=False), "kind")
    assert "podman" not in packages
    assert "golang-github-containernetworking-plugin-dnsname" not in packages
    assert "buildah" in packages  # the node image is made here either way


def test_a_podman_removed_but_not_purged_is_installed_again(tmp_path: Path) -> None:
    """``apt-get remove podman`` leaves its config files: ``dpkg -s`` still says yes."""
    packages = _would_install(_machine(tmp_path, docker=None, podman=False), "kind")
    assert "podman" in packages


def test_no_docker_at_all_gets_podman(tmp_path: Path) -> None:
    packages = _would_install(_machine(tmp_path, docker=None, podman=False), "kind")
    assert "podman" in packages


@pytest.mark.parametrize(
    ("docker", "podman", "expected"),
    [("fails", True, "podman"), ("ok", True, "docker"), ("fails", False, None)],
)
def test_the_kind_provider_picks_the_engine_that_answers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    docker: str,
    podman: bool,
    expected: str | None,
) -> None:
    monkeypatch.setenv("PATH", str(_machine(tmp_path, docker=docker, podman=podman)))
    assert kind.engine() == expected


def test_the_teardown_finds_what_podmans_cni_left_for_our_network(tmp_path: Path) -> None:
    state = tmp_path / "cni"
    ipam = state / "networks" / kind.NETWORK
    ipam.mkdir(parents=True)
    for name in ("lock", "last_reserved_ip.0", "last_reserved_ip.1"):
        (ipam / name).write_text("x")
    other = state / "networks" / "someone-else"
    other.mkdir()
    (state / "results").mkdir()
    ours = state / "results" / f"{kind.NETWORK}-0123abcd-eth0"
    ours.write_text("{}")
    (state / "results" / "someone-else-4567-eth0").write_text("{}")
    assert kind.cni_leftovers(kind.NETWORK, state) == [ipam, ours]
    assert kind.cni_leftovers("absent", tmp_path / "nothing") == []
    assert os.path.isdir(other)


def test_the_kind_networks_bridge_is_read_for_its_dns_rule() -> None:
    # podman 4 on CNI: the bridge is in the plugin list; netavark names it directly.
    cni = '[{"name": "mcpfleet-kind", "plugins": [{"type": "bridge", "bridge": "cni-podman1"}]}]'
    assert kind.bridge_of(cni) == "cni-podman1"
    assert kind.bridge_of('[{"name": "n", "network_interface": "podman2"}]') == "podman2"
    assert kind.bridge_of("not json") is None
    assert kind.bridge_of("[]") is None
    assert kind.dns_rule("cni-podman1") == [
        "INPUT", "-i", "cni-podman1", "-p", "udp", "-m", "udp", "--dport", "53", "-j", "ACCEPT"
    ]  # fmt: skip
