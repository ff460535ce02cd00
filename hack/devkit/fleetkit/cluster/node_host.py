"""What a node changes on the machine, and how to put it back as it was.

A kubelet, containerd, kube-proxy and the CNI plugins change the host: sysctls
(``kernel.panic``, ``vm.overcommit_memory``, ``net.ipv4.ip_forward``...),
iptables chains (``KUBE-*``, ``CNI-*``) and the rules that jump to them, mounts
(container root filesystems, ``/dev/shm`` of sandboxes, network namespaces,
Secret volumes on tmpfs), cgroups, a bridge, a few directories. The machine is
shared (other test tiers run on it at the same time), so the node must leave
it exactly as found and touch nothing it did not create.

:class:`HostState` is a snapshot taken before the node starts; after it stops,
the ``*_undo`` functions compare that snapshot with the machine now and say
what to remove. They are plain functions of plain data (tested without I/O in
``tests/node/test_node_host.py``); :func:`restore` is the thin shell that runs
what they decide.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mcpfleet.dev.wait import WaitTimeout, wait_for

#: Sysctls a kubelet, kube-proxy or the bridge plugin may set; saved and restored.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)

#: Chains created by the node's components. Only new chains with these prefixes,
#: and new rules that jump to them, are ever removed.
CHAIN_PREFIXES = ("KUBE-", "CNI-")

#: Directories outside the node's own that its components create when missing
#: (the kubelet's container log links, libcni's result cache).
FOREIGN_DIRS = ("/var/log/containers", "/var/log/pods", "/var/lib/cni", "/run/netns")

IPTABLES = ("iptables", "ip6tables")


@dataclass
class HostState:
    """The machine's state where a node may change it."""

    sysctls: dict[str, str | None] = field(default_factory=dict)
    #: iptables-save output, per binary (iptables, ip6tables).
    iptables: dict[str, str] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    dirs: dict[str, bool] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> HostState:
        return cls(**json.loads(raw))


# --------------------------------------------------------------------------- pure


def parse_iptables_save(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """``{table: (chains, rules)}`` of an ``iptables-save`` dump; rules are ``-A ...`` lines."""
    tables: dict[str, tuple[list[str], list[str]]] = {}
    current: tuple[list[str], list[str]] | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:].strip(), ([], []))
        elif current is None:
            continue
        elif line.startswith(":"):
            current[0].append(line[1:].split()[0])
        elif line.startswith("-A "):
            current[1].append(line)
    return tables


def _ours(chain: str) -> bool:
    return chain.startswith(CHAIN_PREFIXES)


def _jump_target(rule: list[str]) -> str | None:
    for flag in ("-j", "--jump", "-g", "--goto"):
        if flag in rule:
            i = rule.index(flag)
            if i + 1 < len(rule):
                return rule[i + 1]
    return None


def iptables_undo(before: str, after: str, marks: Sequence[str] = ()) -> list[list[str]]:
    """The iptables arguments that remove what appeared between two dumps, and only that.

    Removed: new chains named ``KUBE-*``/``CNI-*`` (flushed, then deleted), and
    new rules in other chains that jump to one of them or mention one of
    ``marks`` (the node's bridge, its pod range). A rule or chain that existed
    before, or that is not recognisably the node's, is left alone.
    """
    old = parse_iptables_save(before)
    new = parse_iptables_save(after)
    deletes: list[list[str]] = []
    flushes: list[list[str]] = []
    removals: list[list[str]] = []
    for table, (chains, rules) in new.items():
        old_chains, old_rules = old.get(table, ([], []))
        added = [c for c in chains if c not in old_chains and _ours(c)]
        old_rule_set = set(old_rules)
        for line in rules:
            if line in old_rule_set:
                continue
            args = shlex.split(line)
            chain = args[1]
            if chain in added:
                continue  # goes with its chain
            target = _jump_target(args)
            if (target is not None and target in added) or any(m in line for m in marks):
                deletes.append(["-t", table, "-D", *args[1:]])
        flushes += [["-t", table, "-F", c] for c in added]
        removals += [["-t", table, "-X", c] for c in added]
    return deletes + flushes + removals


def mounts_undo(before: Iterable[str], after: Iterable[str], roots: Sequence[str]) -> list[str]:
    """Mount points that appeared under ``roots``, deepest first (the unmount order)."""
    old = set(before)
    prefixes = [r.rstrip("/") + "/" for r in roots]
    new = [m for m in dict.fromkeys(after) if m not in old]
    mine = [m for m in new if any((m + "/").startswith(p) for p in prefixes)]
    return sorted(mine, key=lambda m: (-m.count("/"), m))


def sysctls_undo(before: dict[str, str | None], now: dict[str, str | None]) -> dict[str, str]:
    """The sysctls that changed, with the value to write back."""
    return {
        name: value
        for name, value in before.items()
        if value is not None and now.get(name) is not None and now[name] != value
    }


def links_undo(before: Iterable[str], after: Iterable[str], names: Sequence[str]) -> list[str]:
    """Of the links named ``names`` (the node's bridge), those that are new."""
    old = set(before)
    return [n for n in after if n in names and n not in old]


def dirs_undo(before: dict[str, bool], now: dict[str, bool]) -> list[str]:
    """Directories that did not exist before and do now."""
    return [d for d, existed in before.items() if not existed and now.get(d)]


# --------------------------------------------------------------------------- I/O


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str | None:
    try:
        return _sysctl_path(name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value + "\n")


def iptables_save(binary: str) -> str:
    try:
        result = subprocess.run(
            [f"{binary}-save"], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        return ""
    return result.stdout if result.returncode == 0 else ""


def mount_points() -> list[str]:
    """Every mount point of this mount namespace (octal escapes decoded)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.append(raw.encode().decode("unicode_escape"))
    return points


def link_names() -> list[str]:
    return sorted(os.listdir("/sys/class/net"))


def snapshot() -> HostState:
    return HostState(
        sysctls={name: read_sysctl(name) for name in SYSCTLS},
        iptables={binary: iptables_save(binary) for binary in IPTABLES},
        links=link_names(),
        mounts=mount_points(),
        dirs={d: os.path.isdir(d) for d in FOREIGN_DIRS},
    )


_MNT_DETACH = 2


def unmount(path: str) -> None:
    """umount(2), lazily if busy; a path that is no longer mounted is fine."""
    libc = ctypes.CDLL(None, use_errno=True)
    for flags in (0, _MNT_DETACH):
        if libc.umount2(path.encode(), flags) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return
    raise OSError(err, f"umount {path}: {os.strerror(err)}")


@dataclass
class RestoreReport:
    """What :func:`restore` removed or wrote back, and what it could not."""

    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def restore(
    before: HostState,
    *,
    roots: Sequence[str],
    links: Sequence[str],
    marks: Sequence[str],
) -> RestoreReport:
    """Undo, in a safe order, what appeared since ``before``: mounts, iptables, links, sysctls.

    Processes must be gone already (the caller stops them): a mount still in
    use is detached lazily rather than left.
    """
    report = RestoreReport()

    def attempt(what: str, action: object) -> None:
        try:
            assert callable(action)
            action()
            report.done.append(what)
        except Exception as exc:
            report.failed.append(f"{what}: {type(exc).__name__}: {exc}")

    for point in mounts_undo(before.mounts, mount_points(), roots):
        attempt(f"umount {point}", lambda p=point: unmount(p))
    for binary in IPTABLES:
        after = iptables_save(binary)
        for args in iptables_undo(before.iptables.get(binary, ""), after, marks):
            attempt(
                f"{binary} {' '.join(args)}",
                lambda a=args, b=binary: subprocess.run(
                    [b, "-w", "5", *a], capture_output=True, timeout=30, check=True
                ),
            )
    for name in links_undo(before.links, link_names(), links):
        attempt(
            f"ip link del {name}",
            lambda n=name: subprocess.run(
                ["ip", "link", "del", n], capture_output=True, timeout=30, check=True
            ),
        )
    now = {name: read_sysctl(name) for name in before.sysctls}
    for name, value in sysctls_undo(before.sysctls, now).items():
        attempt(f"sysctl {name}={value}", lambda n=name, v=value: write_sysctl(n, v))
    for directory in dirs_undo(before.dirs, {d: os.path.isdir(d) for d in before.dirs}):
        # Only when empty: anything inside was put there by someone else since.
        attempt(f"rmdir {directory}", lambda d=directory: _rmdir_tree_if_empty(Path(d)))
    return report


#: How long a directory may stay busy (EBUSY: the kernel still releasing a
#: mount detached a moment ago) before removing it counts as failed.
BUSY_DEADLINE = 10.0


def _rmdir_tree_if_empty(path: Path, busy_deadline: float = BUSY_DEADLINE) -> None:
    """Remove ``path`` and its empty subdirectories; refuse (OSError) if a file remains.

    A directory that is busy (a mount on it being released) is tried again
    until ``busy_deadline`` seconds have passed; any other error is final.
    """
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()

    class _Busy(OSError):
        pass

    def removed() -> bool:
        try:
            path.rmdir()
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise _Busy(exc.errno, str(exc)) from exc
            raise
        return True

    try:
        wait_for(removed, timeout=busy_deadline, what=f"{path} to be released", retry_on=(_Busy,))
    except WaitTimeout as exc:
        raise OSError(errno.EBUSY, f"{path} still busy after {busy_deadline:.0f}s") from exc


def differences(before: HostState, roots: Sequence[str], links: Sequence[str]) -> list[str]:
    """What is still different from ``before``, in the places a node changes.

    Used by the teardown test and by ``cluster down`` to report leftovers.
    """
    out: list[str] = []
    now = snapshot()
    for name, value in sysctls_undo(before.sysctls, now.sysctls).items():
        out.append(f"sysctl {name} is {now.sysctls[name]}, was {value}")
    for binary in IPTABLES:
        for args in iptables_undo(before.iptables.get(binary, ""), now.iptables.get(binary, "")):
            out.append(f"{binary} leftover: {' '.join(args)}")
    out += [f"link {n} remains" for n in links_undo(before.links, now.links, links)]
    out += [f"mount {m} remains" for m in mounts_undo(before.mounts, now.mounts, roots)]
    out += [f"directory {d} was created" for d in dirs_undo(before.dirs, now.dirs)]
    return out
