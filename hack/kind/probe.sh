#!/usr/bin/env bash
# Can this machine host a kind node? The smallest check that says so:
#
#   flock /tmp/mcpfleet-cluster.lock bash hack/kind/probe.sh
#
# 1. a Debian root filesystem with systemd, containerd and runc (mmdebstrap,
#    from the mirror this machine's apt uses; cached in .cache/kind/probe-rootfs);
# 2. a privileged podman container from it, started the way kind's podman
#    provider starts a node (--privileged, --cgroupns=private, tmpfs /run and
#    /tmp, a volume on /var, /lib/modules read-only, its own bridge network),
#    with /sbin/init as PID 1;
# 3. systemd reaches "running" and containerd.service is active inside it;
# 4. `ctr run` of a trivial container inside that containerd prints a line.
#
# The host quirks it accounts for, each found by a failed run here:
# - no CAP_SYS_RESOURCE and a hard nofile limit below podman's default
#   (1048576): without --ulimit, runc fails with "error setting rlimits for
#   ready process: error setting rlimit type 7: operation not permitted"
#   (type 7 is RLIMIT_NOFILE; with nofile lowered, "type 6", RLIMIT_NPROC);
# - no /lib/modules on the host: kind's --volume /lib/modules:/lib/modules:ro
#   fails with "statfs /lib/modules: no such file or directory";
# - no CAP_SYS_RESOURCE also means a container cannot lower its
#   oom_score_adj (step 5 shows it): the node's containerd CRI config needs
#   restrict_oom_score_adj = true.
#
# Prints "probe: WORKS" or "probe: FAILS at <step>: <error>" and exits 0 or 1;
# removes its container, volume and network (and the CNI chains the network
# created) whatever happens.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
name=mcpfleet-kind-probe
cache="$root/.cache/kind"
rootfs="$cache/probe-rootfs"
log() { echo "probe: $*" >&2; }
fail() {
	echo "probe: FAILS at $1: $2"
	exit 1
}

for tool in podman mmdebstrap iptables-save; do
	command -v "$tool" >/dev/null || fail setup "$tool is not installed (bash hack/ensure-debs.sh kind)"
done
mkdir -p "$cache/empty-modules"

if [[ ! -x "$rootfs/sbin/init" ]]; then
	log "making $rootfs with mmdebstrap"
	mapfile -t mirrors < <(python3 "$root/hack/image/apt-sources.py" bookworm)
	rm -rf "$rootfs.tmp"
	mmdebstrap --mode=root --variant=minbase --format=directory --quiet \
		--include=systemd,systemd-sysv,dbus,containerd,runc,iproute2 \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--aptopt='Acquire::Languages "none"' --aptopt='APT::Install-Recommends "false"' \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
		bookworm "$rootfs.tmp" "${mirrors[@]}" >"$cache/probe-mmdebstrap.log" 2>&1 ||
		fail rootfs "mmdebstrap failed: $(tail -3 "$cache/probe-mmdebstrap.log")"
	mv "$rootfs.tmp" "$rootfs"
fi

chains_before="$(iptables-save 2>/dev/null | grep -c '^:CNI-' || true)"
cleanup() {
	podman rm -f "$name" >/dev/null 2>&1 || true
	podman volume rm -f "$name-var" >/dev/null 2>&1 || true
	podman network rm -f "$name" >/dev/null 2>&1 || true
	# The CNI firewall plugin leaves CNI-FORWARD/CNI-ADMIN behind: remove them
	# only if this probe made them (none were there before).
	if [[ "$chains_before" == 0 ]]; then
		for ipt in iptables ip6tables; do
			"$ipt" -D FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD 2>/dev/null || true
			for chain in CNI-FORWARD CNI-ADMIN; do
				"$ipt" -F "$chain" 2>/dev/null || true
				"$ipt" -X "$chain" 2>/dev/null || true
			done
		done
	fi
}
trap cleanup EXIT
cleanup

nofile="$(ulimit -Hn)"
nproc="$(ulimit -Hu)"
[[ "$nofile" == unlimited ]] && nofile=1048576
[[ "$nproc" == unlimited ]] && nproc=32768
((nproc > 32768)) && nproc=32768
out="$(podman network create -d=bridge "$name" 2>&1)" || fail network "$out"
out="$(podman volume create "$name-var" 2>&1)" || fail volume "$out"
out="$(podman run --detach --tty --name "$name" --hostname "$name" --net "$name" \
	-e container=podman --cgroupns=private --privileged \
	--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" \
	--tmpfs /tmp --tmpfs /run --volume "$name-var:/var:suid,exec,dev" \
	--volume "$cache/empty-modules:/lib/modules:ro" \
	--rootfs "$rootfs" /sbin/init 2>&1)" || fail "podman run" "$out"

state=""
deadline=$((SECONDS + 90))
while ((SECONDS < deadline)); do
	state="$(podman exec "$name" systemctl is-system-running 2>/dev/null || true)"
	[[ "$state" == running || "$state" == degraded ]] && break
	podman exec "$name" true 2>/dev/null || fail systemd "the container exited: $(podman logs "$name" 2>&1 | tail -5)"
	sleep 0.5 # polling the container's systemd: there is no event to wait on from outside
done
[[ "$state" == running || "$state" == degraded ]] || fail systemd "systemd is '$state' after 90 s"
log "systemd: $state"
podman exec "$name" systemctl is-active --quiet containerd ||
	fail containerd "$(podman exec "$name" systemctl status containerd --no-pager 2>&1 | tail -5)"
log "containerd.service: active"

# A trivial container: the node's own root, bind-mounted read-only, as rootfs.
out="$(podman exec "$name" sh -euc '
	mkdir -p /var/probe-root
	mount --bind / /var/probe-root
	mount -o remount,ro,bind /var/probe-root
	ctr run --rm --rootfs /var/probe-root probe /bin/echo hello-from-a-nested-container
	umount /var/probe-root' 2>&1)" || fail "ctr run" "$out"
[[ "$out" == *hello-from-a-nested-container* ]] || fail "ctr run" "unexpected output: $out"
log "ctr run: $out"

# What restrict_oom_score_adj works around: lowering oom_score_adj is refused.
if podman exec "$name" sh -c 'echo -998 >/proc/self/oom_score_adj' 2>/dev/null; then
	log "oom_score_adj can be lowered here (restrict_oom_score_adj is not needed)"
else
	log "oom_score_adj cannot be lowered here: the node's CRI needs restrict_oom_score_adj = true"
fi
echo "probe: WORKS"
