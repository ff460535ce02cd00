"""A multi-node kind cluster on this machine: ``make kind-up`` / ``make kind-down``.

kind runs each node as a privileged container: with a Docker engine where one
answers, else with podman (kind's ``KIND_EXPERIMENTAL_PROVIDER=podman``). The
node image is the one ``make kind-image`` builds here (hack/kind/node-image.sh:
Kubernetes from the hack/tools pins, no registry), the cluster is
``deploy/kind/cluster.yaml`` (one control plane, two workers), and the
project's images (``make image``) go in with ``kind load image-archive``.

The machine is shared, so the cluster leaves it as found: :func:`down` deletes
the nodes, their network and volumes, then removes the iptables chains and
sysctls the engine's CNI changed (:mod:`fleetkit.cluster.node_host`, against the
snapshot :func:`up` saved), and ``/lib/modules`` if :func:`up` had to create it.

Facts about this kind of machine that shaped it (each cost a failed attempt,
``hack/kind/probe.sh`` reproduces them): no CAP_SYS_RESOURCE and a hard nofile
limit of 20000, so podman's default rlimits are refused ("error setting rlimit
type 7: operation not permitted"): a containers.conf asks for what the host
allows; no ``/lib/modules`` on the host, which kind always mounts read-only
("statfs /lib/modules: no such file or directory"); cgroup v1/v2 hybrid,
handled by the node image and the kubeadm patches of ``cluster.yaml``.

The host reaches the cluster's Services at their ClusterIPs, as it does on
the local node: :func:`up` routes ``deploy/kind/cluster.yaml``'s Service range
through the control-plane node, whose kube-proxy forwards (and masquerades) to
the pods on any node; :func:`down` removes the route.

    python -m fleetkit.cluster.kind up [--name NAME]     # prints export KUBECONFIG=<path>
    python -m fleetkit.cluster.kind load IMAGE [--name NAME]   # prints loaded: IMAGE
    python -m fleetkit.cluster.kind down [--name NAME]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from fleetkit.cluster import node_host
from fleetkit.cluster.controlplane import repo_root, tools_bin_dir

DEFAULT_NAME = "mcpfleet"
#: The engine network the nodes share (kind's own default, "kind", is left to others).
NETWORK = "mcpfleet-kind"
CONFIG = repo_root() / "deploy" / "kind" / "cluster.yaml"
NODE_IMAGE_SCRIPT = repo_root() / "hack" / "kind" / "node-image.sh"
IMAGE_LINE = "kind node image: "
#: kind mounts this from the host into every node, read-only, and fails without it.
LIB_MODULES = Path("/lib/modules")


def service_subnet(config: Path = CONFIG) -> str:
    """The cluster's Service range, as ``deploy/kind/cluster.yaml`` sets it."""
    doc = yaml.safe_load(config.read_text())
    subnet = str((doc.get("networking") or {}).get("serviceSubnet", ""))
    if not subnet:
        raise RuntimeError(f"{config} sets no networking.serviceSubnet (the host routes it)")
    return str(ipaddress.ip_network(subnet))


def state_dir(name: str) -> Path:
    return repo_root() / ".cache" / "kind" / "clusters" / name


def kind_binary() -> str | None:
    built = tools_bin_dir() / "kind"
    if built.exists():
        return str(built)
    return shutil.which("kind")


def engine() -> str | None:
    """``docker`` where a Docker engine answers, else ``podman`` if installed, else None."""
    if shutil.which("docker") is not None:
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return "docker"
    if shutil.which("podman") is not None:
        return "podman"
    return None


def missing() -> list[str]:
    """Why a kind cluster cannot start here (empty: it can)."""
    reasons = []
    if kind_binary() is None:
        reasons.append("kind is not built (make kind-image builds it into .cache/bin)")
    eng = engine()
    if eng is None:
        reasons.append("neither a Docker engine nor podman: bash hack/ensure-debs.sh kind")
    elif eng == "podman" and os.geteuid() != 0:
        reasons.append("kind on podman needs root here (rootless podman lacks cgroup delegation)")
    return reasons


def containers_conf(hard_nofile: int, hard_nproc: int) -> str:
    """podman's containers.conf for the nodes: rlimits the host allows, runc (not crun)."""
    nproc = min(hard_nproc, 32768)
    return (
        "[containers]\n"
        f'default_ulimits = ["nofile={hard_nofile}:{hard_nofile}", "nproc={nproc}:{nproc}"]\n'
        "\n[engine]\n"
        'runtime = "runc"\n'
    )


@dataclass(frozen=True)
class KindSetup:
    """The command lines and environment of one kind cluster (pure: unit-tested)."""

    name: str
    engine: str
    image: str
    kubeconfig: Path
    kind: str = "kind"
    config: Path = CONFIG
    containers_conf: Path | None = None

    def env(self) -> dict[str, str]:
        env = {
            "KIND_EXPERIMENTAL_PROVIDER": self.engine,
            "KIND_EXPERIMENTAL_DOCKER_NETWORK": NETWORK,
            "KIND_EXPERIMENTAL_PODMAN_NETWORK": NETWORK,
        }
        if self.containers_conf is not None:
            env["CONTAINERS_CONF"] = str(self.containers_conf)
        return env

    def create(self, wait: str = "300s") -> list[str]:
        return [
            self.kind, "create", "cluster", "--name", self.name, "--image", self.image,
            "--config", str(self.config), "--kubeconfig", str(self.kubeconfig), "--wait", wait,
        ]  # fmt: skip

    def load(self, archive: Path, nodes: Sequence[str] = ()) -> list[str]:
        """``kind load image-archive``: into every node, or only into ``nodes``."""
        line = [self.kind, "load", "image-archive", str(archive), "--name", self.name]
        return [*line, "--nodes", ",".join(nodes)] if nodes else line

    def delete(self) -> list[str]:
        return [
            self.kind, "delete", "cluster", "--name", self.name,
            "--kubeconfig", str(self.kubeconfig),
        ]  # fmt: skip

    def get_clusters(self) -> list[str]:
        return [self.kind, "get", "clusters"]

    def node_names(self) -> list[str]:
        return [self.kind, "get", "nodes", "--name", self.name]

    def save_image(self, image: str, archive: Path) -> list[str]:
        """The image out of the engine's local storage, as a docker-archive."""
        if self.engine == "podman":
            return ["podman", "save", "--format", "docker-archive", "-o", str(archive), image]
        return ["docker", "save", "-o", str(archive), image]

    def node_ip(self, node: str) -> list[str]:
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        return [self.engine, "inspect", "--format", fmt, node]

    def control_plane(self) -> str:
        return f"{self.name}-control-plane"

    def stop_node(self, node: str) -> list[str]:
        """The node's container stopped as a machine is shut down (SIGRTMIN+3 to its
        systemd, SIGKILL after the engine's 10 s): the node is lost to the cluster."""
        return [self.engine, "stop", node]

    def pause_node(self, node: str) -> list[str]:
        """Every process of the node frozen (the cgroup freezer), as a machine that hangs
        or drops off the network: the node and its pods stop answering and renewing
        anything, keep their state and their address, and go on where they stopped when
        thawed. (A stopped node cannot come back here: podman gives its container a new
        address on start, which its kubelet's --node-ip and the CNI's BGP peers do not
        follow.)"""
        return [self.engine, "pause", node]

    def unpause_node(self, node: str) -> list[str]:
        return [self.engine, "unpause", node]


def route_commands(subnet: str, via: str) -> tuple[list[str], list[str]]:
    """The host route to the Service range through a node: (add, delete)."""
    return (
        ["ip", "route", "replace", subnet, "via", via],
        ["ip", "route", "del", subnet, "via", via],
    )


def image_from_output(out: str) -> str:
    """The node image named by node-image.sh's last ``kind node image:`` line."""
    for line in reversed(out.splitlines()):
        if line.startswith(IMAGE_LINE):
            return line[len(IMAGE_LINE) :].strip()
    raise RuntimeError(f"hack/kind/node-image.sh printed no {IMAGE_LINE!r} line")


def build_node_image() -> str:
    """``make kind-image``: the node image's name (built only when its inputs changed)."""
    result = subprocess.run(
        ["bash", str(NODE_IMAGE_SCRIPT)], stdout=subprocess.PIPE, text=True, timeout=3600
    )
    if result.returncode != 0:
        raise RuntimeError(f"hack/kind/node-image.sh failed (exit {result.returncode})")
    return image_from_output(result.stdout)


def _setup(name: str, image: str = "") -> KindSetup:
    eng = engine()
    kind = kind_binary()
    if eng is None or kind is None:
        raise RuntimeError("; ".join(missing()))
    conf = None
    if eng == "podman":
        import resource

        conf = state_dir(name).parent / "containers.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        conf.write_text(
            containers_conf(
                nofile if nofile != resource.RLIM_INFINITY else 1048576,
                nproc if nproc != resource.RLIM_INFINITY else 32768,
            )
        )
    return KindSetup(
        name=name,
        engine=eng,
        image=image,
        kubeconfig=state_dir(name) / "kubeconfig",
        kind=kind,
        containers_conf=conf,
    )


def _run(
    setup: KindSetup, argv: Sequence[str], timeout: float, check: bool = True, merge: bool = True
) -> str:
    """Run a kind command; its output (with stderr unless ``merge=False``: kind warns there)."""
    result = subprocess.run(
        list(argv),
        env={**os.environ, **setup.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.DEVNULL,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {result.returncode}):\n{result.stdout}")
    return result.stdout


def exists(setup: KindSetup) -> bool:
    return setup.name in _run(setup, setup.get_clusters(), 60, check=False, merge=False).split()


def up(name: str = DEFAULT_NAME, archives: Sequence[Path] = ()) -> KindSetup:
    """Create the cluster (or find it) and load ``archives``; the kubeconfig: ``.kubeconfig``."""
    image = build_node_image()
    setup = _setup(name, image)
    if exists(setup):
        if not _route_file(name).exists():
            _route_services(setup)
        return setup
    state = state_dir(name)
    state.mkdir(parents=True, exist_ok=True)
    before = state / "host.json"
    if not before.exists():
        before.write_text(node_host.snapshot().to_json())
    if not LIB_MODULES.exists():
        LIB_MODULES.mkdir()
        (state.parent / "made-lib-modules").touch()
    try:
        _run(setup, setup.create(), 900)
        for archive in archives:
            _run(setup, setup.load(archive), 900)
        _route_services(setup)
    except BaseException:
        print(f"kind-up: creating {name} failed; cleaning up", file=sys.stderr)
        down(name)
        raise
    return setup


def _route_file(name: str) -> Path:
    return state_dir(name) / "service-route"


def _route_services(setup: KindSetup) -> None:
    """Route the Service range through the control-plane node (see the module doc)."""
    subnet = service_subnet(setup.config)
    held = subprocess.run(
        ["ip", "route", "show", subnet], capture_output=True, text=True, check=True
    ).stdout.strip()
    if held:
        raise RuntimeError(
            f"the host already routes {subnet} ({held}): another kind cluster of ours? "
            "make kind-down (or python -m fleetkit.cluster.kind down --name NAME) first"
        )
    via = _run(setup, setup.node_ip(setup.control_plane()), 60, merge=False).strip()
    ipaddress.ip_address(via)  # a clear error rather than a bad route
    add, _ = route_commands(subnet, via)
    subprocess.run(add, check=True, capture_output=True, timeout=30)
    _route_file(setup.name).write_text(f"{subnet} {via}\n")


def _unroute_services(name: str) -> list[str]:
    path = _route_file(name)
    if not path.exists():
        return []
    subnet, via = path.read_text().split()
    _, delete = route_commands(subnet, via)
    done = subprocess.run(delete, capture_output=True, text=True, timeout=30, check=False)
    gone = not subprocess.run(
        ["ip", "route", "show", subnet], capture_output=True, text=True, check=False
    ).stdout.strip()
    return [] if gone else [f"route {subnet} via {via}: {done.stderr.strip()}"]


def stop_node(name: str, node: str) -> None:
    """Stop one node of cluster ``name`` (its container; ``down`` still deletes it)."""
    setup = _setup(name)
    if node not in _run(setup, setup.node_names(), 60, merge=False).split():
        raise RuntimeError(f"kind cluster {name} has no node {node}")
    _run(setup, setup.stop_node(node), 120)


def pause_node(name: str, node: str) -> None:
    """Freeze one node of cluster ``name`` (:meth:`KindSetup.pause_node`)."""
    setup = _setup(name)
    if node not in _run(setup, setup.node_names(), 60, merge=False).split():
        raise RuntimeError(f"kind cluster {name} has no node {node}")
    _run(setup, setup.pause_node(node), 120)


def unpause_node(name: str, node: str) -> None:
    """Thaw a node :func:`pause_node` froze (``down`` deletes a frozen one too)."""
    setup = _setup(name)
    _run(setup, setup.unpause_node(node), 120)


def load_archive(name: str, archive: Path, nodes: Sequence[str] = ()) -> None:
    """A docker-archive (``make image`` writes them) into the nodes of cluster ``name``
    (every node, or only ``nodes``)."""
    setup = _setup(name)
    _run(setup, setup.load(archive, nodes), 900)


def load_image(name: str, image: str) -> None:
    """An image of the engine's local storage (buildah/podman's here) into every node.

    Saved with the engine, then ``kind load image-archive``: ``kind load
    docker-image`` asks the ``docker`` command, which finds no daemon here.
    """
    import tempfile

    setup = _setup(name)
    if not exists(setup):
        raise RuntimeError(f"no kind cluster {name}: make kind-up first")
    with tempfile.TemporaryDirectory(prefix="kind-load-") as tmp:
        archive = Path(tmp) / "image.tar"
        _run(setup, setup.save_image(image, archive), 900)
        _run(setup, setup.load(archive), 900)


#: Where libcni keeps host-local IPAM state per network, and its result cache.
CNI_STATE = Path("/var/lib/cni")


def cni_leftovers(network: str, state: Path = CNI_STATE) -> list[Path]:
    """What podman's CNI left on the host for ``network`` once its containers are gone:
    the host-local IPAM directory (``networks/<network>``: a lock, the last reserved
    addresses) and cached results (``results/<network>-*``). Pure on the path given."""
    found = [state / "networks" / network]
    results = state / "results"
    if results.is_dir():
        found += sorted(results.glob(f"{network}-*"))
    return [p for p in found if p.exists()]


def _remove_cni_leftovers(network: str) -> list[str]:
    failed = []
    for path in cni_leftovers(network):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:
            failed.append(f"remove {path}: {exc}")
    return failed


#: The rule podman's dnsname plugin adds for a network's bridge (DNS to its
#: dnsmasq) and leaves behind when the network is removed.
def dns_rule(bridge: str) -> list[str]:
    return ["INPUT", "-i", bridge, "-p", "udp", "-m", "udp", "--dport", "53", "-j", "ACCEPT"]


def bridge_of(inspect_json: str) -> str | None:
    """The bridge interface of a network, from ``podman network inspect``'s JSON (its
    CNI plugins' ``bridge``, or netavark's ``network_interface``); None if absent."""
    import json

    try:
        nets = json.loads(inspect_json)
    except ValueError:
        return None
    for net in nets if isinstance(nets, list) else [nets]:
        if not isinstance(net, dict):
            continue
        if isinstance(net.get("network_interface"), str):
            return str(net["network_interface"])
        for plugin in net.get("plugins") or []:
            if isinstance(plugin, dict) and isinstance(plugin.get("bridge"), str):
                return str(plugin["bridge"])
    return None


def _remove_dns_rule(bridge: str) -> list[str]:
    """Delete the dnsname plugin's INPUT rule for our network's bridge (each copy)."""
    if shutil.which("iptables") is None:
        return []
    for _ in range(8):
        check = subprocess.run(
            ["iptables", "-C", *dns_rule(bridge)], capture_output=True, timeout=30, check=False
        )
        if check.returncode != 0:
            return []
        subprocess.run(
            ["iptables", "-D", *dns_rule(bridge)], capture_output=True, timeout=30, check=False
        )
    return [f"iptables: the DNS rule for {bridge} could not be removed"]


def _engine_rm(setup: KindSetup, *argv: str) -> None:
    subprocess.run(
        [setup.engine, *argv],
        env={**os.environ, **setup.env()},
        capture_output=True,
        timeout=120,
        check=False,
    )


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Delete the cluster and put the machine back; returns what could not be undone."""
    setup = _setup(name)
    state = state_dir(name)
    failed: list[str] = _unroute_services(name)
    _run(setup, setup.delete(), 300, check=False)
    # kind leaves its network behind; this one is only ours, and the host is
    # put back when the last of our clusters (those with a state dir) is gone.
    listed = _run(setup, setup.get_clusters(), 60, check=False, merge=False).split()
    others = [c for c in listed if c != name]
    ours_left = [c for c in others if (state.parent / c / "host.json").exists()]
    if not ours_left:
        inspect = subprocess.run(
            [setup.engine, "network", "inspect", NETWORK],
            env={**os.environ, **setup.env()},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        bridge = bridge_of(inspect.stdout) if inspect.returncode == 0 else None
        _engine_rm(setup, "network", "rm", "-f", NETWORK)
        if bridge is not None:
            failed += _remove_dns_rule(bridge)
        # The network is ours by name, and so is the IPAM state podman's CNI
        # keeps for it (a new machine has no /var/lib/cni before the first run).
        failed += _remove_cni_leftovers(NETWORK)
        before_file = state / "host.json"
        if before_file.exists():
            before = node_host.HostState.from_json(before_file.read_text())
            # /run/netns: the engine bind-mounts it onto itself (shared) for the
            # nodes' network namespaces; unmounted when it was not there before.
            roots = ["/var/lib/containers", "/var/lib/docker", "/run/netns"]
            failed += node_host.restore(before, roots=roots, links=[], marks=[]).failed
            failed += node_host.differences(before, roots=roots, links=[])
        marker = state.parent / "made-lib-modules"
        if marker.exists():
            try:
                LIB_MODULES.rmdir()
                marker.unlink()
            except OSError as exc:
                failed.append(f"rmdir {LIB_MODULES}: {exc}")
    if state.exists():
        shutil.rmtree(state)
    return failed


def diagnostics(name: str = DEFAULT_NAME, lines: int = 20) -> str:
    """The last kubelet and containerd journal lines of every node (to explain a failure)."""
    try:
        setup = _setup(name)
        nodes = _run(setup, setup.node_names(), 60, check=False, merge=False).split()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return f"no diagnostics: {exc}"
    out = []
    for node in nodes:
        journal = subprocess.run(
            [setup.engine, "exec", node, "journalctl", "--no-pager", "-n", str(lines),
             "-u", "kubelet", "-u", "containerd"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        out.append(f"== {node}\n{journal.stdout}{journal.stderr}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetkit.cluster.kind", description=__doc__)
    parser.add_argument("command", choices=["up", "load", "down"])
    parser.add_argument("image", nargs="?", help="load: the image, e.g. localhost/myapp:1")
    parser.add_argument("--name", default=DEFAULT_NAME)
    parser.add_argument(
        "--no-images", action="store_true", help="do not kind-load the project's images"
    )
    args = parser.parse_args(argv)
    if args.command == "up":
        archives: list[Path] = []
        if not args.no_images:
            from fleetkit.cluster.node import Images

            archives = [a for a in Images().archives if "pause" not in a.name]
            absent = [str(a) for a in archives if not a.exists()]
            if absent:
                print(f"kind-up: no image archives {absent}: run make image", file=sys.stderr)
                return 1
        setup = up(args.name, archives)
        print(f"export KUBECONFIG={setup.kubeconfig}")
        return 0
    if args.command == "load":
        if not args.image:
            parser.error("load needs the image, e.g. localhost/myapp:1")
        load_image(args.name, args.image)
        print(f"loaded: {args.image}")
        return 0
    failed = down(args.name)
    for line in failed:
        print(f"kind-down: left behind: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
