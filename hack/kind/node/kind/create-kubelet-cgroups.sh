#!/bin/bash
# Before the kubelet starts: its cgroupRoot ("/kubelet", which the systemd
# cgroup driver names kubelet.slice) must exist in every cgroup hierarchy.
# With cgroup v1, systemd makes a slice's cgroups only in the controllers it
# manages (not cpuset or hugetlb), and only once something runs in it, so the
# kubelet would fail with 'cgroup ["kubelet"] has some missing paths'. Make
# them here; a new cpuset cgroup also needs its CPUs and memory nodes.
# On a pure cgroup v2 host systemd does all of it.
set -euo pipefail
[[ -f /sys/fs/cgroup/cgroup.controllers ]] && exit 0
for hierarchy in /sys/fs/cgroup/*/; do
	[[ -f "$hierarchy/cgroup.procs" ]] || continue
	slice="$hierarchy/kubelet.slice"
	mkdir -p "$slice"
	for knob in cpuset.cpus cpuset.mems; do
		if [[ -f "$hierarchy/$knob" && -z "$(cat "$slice/$knob")" ]]; then
			cat "$hierarchy/$knob" >"$slice/$knob"
		fi
	done
done
