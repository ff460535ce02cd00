#!/usr/bin/env bash
# The kind node image, made here with no registry (make kind-image):
#
#   bash hack/kind/node-image.sh     # last line: "kind node image: <name>"
#
# - the root filesystem: Debian (mmdebstrap, from the mirror this machine's apt
#   uses) with what kind's own base image holds: systemd, containerd, runc,
#   the CNI plugins, iptables, conntrack, ...; crictl, and the entrypoint of
#   hack/kind/node/ (the same jobs as kind's);
# - kubeadm, kubelet, kubectl and the control-plane images (kube-apiserver,
#   kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS, pause)
#   built from the pins in hack/tools/ (hack/kind/pause for pause), named
#   localhost/mcpfleet-kind/<name>:<pinned version> (deploy/kind/cluster.yaml
#   points kubeadm at them), already imported into the node's containerd;
# - the CNI: kube-router (kindnetd is not on the Go module proxy), applied by
#   kind from /kind/manifests/default-cni.yaml.
#
# The image's tag is a hash of everything above: it is made once and reused
# until a pin, a file under hack/kind/ or the mirror changes. Needs root,
# mmdebstrap, buildah and containerd (bash hack/ensure-debs.sh kind node).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
suite=bookworm
bin="$root/.cache/bin"
cache="$root/.cache/kind"
repo=localhost/mcpfleet-kind
log() { echo "kind-image: $*" >&2; }
die() {
	log "$*"
	exit 1
}
mkdir -p "$cache/images"
# buildah on this kind of machine: runc, host network for RUN, lowered rlimits.
# shellcheck source=hack/image/containers-env.sh
source "$root/hack/image/containers-env.sh"
# shellcheck source=hack/image/debian-rootfs.sh
source "$root/hack/image/debian-rootfs.sh"

for tool in mmdebstrap buildah containerd ctr; do
	command -v "$tool" >/dev/null || die "$tool is not installed: bash hack/ensure-debs.sh kind node"
done

start=$SECONDS
mapfile -t mirrors < <(python3 "$root/hack/image/apt-sources.py" "$suite")

# ------------------------------------------------------------------ rootfs
# rootfs NAME PACKAGES: a Debian minbase tarball with these packages, cached by
# their list and the mirrors.
rootfs() {
	local name="$1" packages="$2" key tarball
	key="$( (printf '%s\n' "$packages" "$suite" "${mirrors[@]}"; cat "$root/hack/image/debian-rootfs.sh") | sha256sum | cut -c1-10)"
	tarball="$cache/$name-$key.tar"
	if [[ ! -f "$tarball" ]]; then
		local t=$SECONDS
		rm -f "$cache/$name"-*.tar
		debian_rootfs "$suite" "$packages" "$tarball" "$cache/mmdebstrap-$name.log" "${mirrors[@]}" ||
			die "mmdebstrap $name failed"
		log "made the $name root filesystem in $((SECONDS - t))s"
	fi
	echo "$tarball"
}

# ------------------------------------------------------------------ binaries
tools=(kubeadm kubelet kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd coredns crictl kube-router)
# kind itself is not in the image, but make kind-up needs it.
bash "$root/hack/tools/build.sh" "$bin" "${tools[@]}" kind >&2
(cd "$here/pause" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath" \
	go build -ldflags "-s -w" -o "$cache/pause" .)

modver() { (cd "$root/hack/tools${2:+/$2}" && go list -m -f '{{.Version}}' "$1"); }
k8s="$(modver k8s.io/kubernetes)"
etcd="$(modver go.etcd.io/etcd/server/v3)"
coredns="$(modver github.com/coredns/coredns)"
kube_router="$(modver github.com/cloudnativelabs/kube-router/v2)"
pause_tag=mcpfleet-1
# kubeadm finds its images through deploy/kind/cluster.yaml: the tags there
# must be the ones built here (a pin moved without it is an error, not a pull).
config="$root/deploy/kind/cluster.yaml"
for want in "imageRepository: $repo" "imageTag: $etcd" "imageTag: $coredns"; do
	grep -q "$want" "$config" || die "$config lacks '$want' (the pins in hack/tools/ say so): update it"
done

hash="$( (
	cat "$0" "$root/hack/image/debian-rootfs.sh" "$here/pause/main.go"
	find "$here/node" -type f | sort | xargs cat
	cat "$bin"/.stamps/{kubeadm,kubelet,kubectl,kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,etcd,coredns,crictl,kube-router}
	printf '%s\n' "$suite" "${mirrors[@]}"
) | sha256sum | cut -c1-10)"
image="localhost/mcpfleet-kind-node:$k8s-$hash"

if buildah inspect --type image "$image" >/dev/null 2>&1; then
	log "up to date"
	echo "kind node image: $image"
	exit 0
fi

# The root filesystems only now: the image's tag covers their inputs (this
# script's package lists, the suite, the mirrors), so an image that is up to
# date needs neither (a fresh clone has no cached tarballs).
node_tar="$(rootfs node-rootfs systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,ipset,iproute2,conntrack,ethtool,socat,util-linux,mount,kmod,procps,ca-certificates)"
# kube-proxy and kube-router run iptables/ipset from their own images.
netbase_tar="$(rootfs net-base iptables,ipset,iproute2,conntrack,kmod)"

# ------------------------------------------------------------------ images
ctrs=()
cleanup() {
	for c in "${ctrs[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

# component NAME TAG FROM BINARY... : an image of the binaries on FROM (scratch
# or a root filesystem tarball), entrypoint the first one, saved as an archive.
component() {
	local name="$1" tag="$2" from="$3" c
	shift 3
	c="$(buildah from scratch)"
	ctrs+=("$c")
	[[ "$from" != scratch ]] && buildah add --quiet "$c" "$from" / >/dev/null
	for b in "$@"; do
		buildah copy --quiet --chmod 0755 "$c" "$b" "/usr/local/bin/$(basename "$b")" >/dev/null
	done
	buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--entrypoint "[\"/usr/local/bin/$(basename "$1")\"]" --cmd '[]' \
		--label "org.opencontainers.image.title=$name" \
		--label "org.opencontainers.image.version=$tag" "$c"
	buildah commit --quiet --rm "$c" "$repo/$name:$tag" >/dev/null
	rm -f "$cache/images/$name.tar"
	buildah push --quiet "$repo/$name:$tag" "docker-archive:$cache/images/$name.tar:$repo/$name:$tag" >/dev/null
	buildah rmi "$repo/$name:$tag" >/dev/null
	echo "$repo/$name:$tag"
}
images=(
	"$(component kube-apiserver "$k8s" scratch "$bin/kube-apiserver")"
	"$(component kube-controller-manager "$k8s" scratch "$bin/kube-controller-manager")"
	"$(component kube-scheduler "$k8s" scratch "$bin/kube-scheduler")"
	"$(component kube-proxy "$k8s" "$netbase_tar" "$bin/kube-proxy")"
	"$(component etcd "$etcd" scratch "$bin/etcd")"
	"$(component coredns "$coredns" scratch "$bin/coredns")"
	"$(component pause "$pause_tag" scratch "$cache/pause")"
	"$(component kube-router "$kube_router" "$netbase_tar" "$bin/kube-router")"
)
# kubeadm looks for CoreDNS at <imageRepository>/coredns and runs it as /coredns.
log "component images: ${images[*]}"

# ------------------------------------------------------------------ preload
# The images go into the node's containerd store offline: a containerd of the
# same Debian package, on its own root, state and socket, imports the archives
# into the k8s.io namespace; its root becomes the node's /var/lib/containerd.
preload="$cache/preload"
state="/run/mcpfleet-kind-preload"
rm -rf "$preload" "$state"
mkdir -p "$preload/root" "$state"
cat >"$preload/config.toml" <<EOF
version = 2
root = "$preload/root"
state = "$state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$state/containerd.sock"
[ttrpc]
  address = "$state/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
EOF
containerd --config "$preload/config.toml" >"$preload/containerd.log" 2>&1 &
daemon=$!
stop_daemon() {
	kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
	rm -rf "$state"
}
trap 'stop_daemon; cleanup' EXIT
for _ in $(seq 1 100); do
	ctr --address "$state/containerd.sock" version >/dev/null 2>&1 && break
	kill -0 "$daemon" 2>/dev/null || { tail -5 "$preload/containerd.log" >&2; die "containerd (preload) exited"; }
	sleep 0.1 # polling its socket: containerd has no readiness signal here
done
for name in kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd coredns pause kube-router; do
	ctr --address "$state/containerd.sock" --namespace k8s.io images import --snapshotter overlayfs \
		"$cache/images/$name.tar" >/dev/null || die "importing $name into the node's containerd failed"
done
ctr --address "$state/containerd.sock" --namespace k8s.io images ls -q | sort >"$cache/preloaded.txt"
# The layers are unpacked into snapshots now: drop their blobs (what the CRI's
# discard_unpacked_layers does), keeping manifests and configs. Every node
# copies this store into its /var volume, so it is kept small.
python3 - "$state/containerd.sock" >"$preload/dropped.txt" <<'PY'
import json, subprocess, sys
sock = sys.argv[1]
ctr = ["ctr", "--address", sock, "--namespace", "k8s.io"]
out = subprocess.run(ctr + ["images", "ls"], capture_output=True, text=True, check=True).stdout
layers = set()
for line in out.splitlines()[1:]:
    target = line.split()[2]
    manifest = json.loads(subprocess.run(ctr + ["content", "get", target], capture_output=True, check=True).stdout)
    manifests = [target] if "layers" in manifest else [m["digest"] for m in manifest.get("manifests", [])]
    for digest in manifests:
        m = json.loads(subprocess.run(ctr + ["content", "get", digest], capture_output=True, check=True).stdout)
        layers.update(layer["digest"] for layer in m["layers"])
if layers:
    subprocess.run(ctr + ["content", "rm", *sorted(layers)], capture_output=True, check=True)
print("\n".join(sorted(layers)))
print(f"kind-image: dropped {len(layers)} unpacked layer blobs", file=sys.stderr)
PY
stop_daemon
trap cleanup EXIT
# Their files go too (containerd's garbage collector would remove them later,
# the metadata no longer names them).
while read -r digest; do
	rm -f "$preload/root/io.containerd.content.v1.content/blobs/${digest/://}"
done <"$preload/dropped.txt"

# ------------------------------------------------------------------ node
c="$(buildah from scratch)"
ctrs+=("$c")
buildah add --quiet "$c" "$node_tar" / >/dev/null
buildah copy --quiet "$c" "$here/node" / >/dev/null
buildah copy --quiet --chmod 0755 "$c" "$bin/kubeadm" "$bin/kubelet" "$bin/kubectl" "$bin/crictl" /usr/bin/ >/dev/null
# A tarball keeps the store's owners and modes (buildah copy would not).
tar -C "$preload/root" --xattrs -cf "$cache/preload.tar" .
buildah add --quiet "$c" "$cache/preload.tar" /var/lib/containerd >/dev/null
rm -f "$cache/preload.tar"
mnt="$(buildah mount "$c")"
sed -i "s|@PAUSE_IMAGE@|$repo/pause:$pause_tag|" "$mnt/etc/containerd/config.toml"
sed -i "s|@KUBE_ROUTER_IMAGE@|$repo/kube-router:$kube_router|" "$mnt/kind/manifests/default-cni.yaml"
echo "$k8s" >"$mnt/kind/version"
cp "$cache/preloaded.txt" "$mnt/kind/images"
# The CNI plugins where the kubelet and containerd look for them.
mkdir -p "$mnt/opt/cni"
ln -sfn /usr/lib/cni "$mnt/opt/cni/bin"
printf 'runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\n' \
	>"$mnt/etc/crictl.yaml"
# Each node gets its own machine-id from systemd at boot.
: >"$mnt/etc/machine-id"
rm -f "$mnt/var/lib/dbus/machine-id"
# kubelet starts when kubeadm has configured it; containerd with the node.
ln -sf /etc/systemd/system/kubelet.service "$mnt/etc/systemd/system/multi-user.target.wants/kubelet.service"
# Units that have nothing to do in a node container.
for unit in getty.target systemd-udevd.service systemd-udev-trigger.service systemd-modules-load.service \
	systemd-remount-fs.service console-getty.service; do
	ln -sf /dev/null "$mnt/etc/systemd/system/$unit"
done
buildah umount "$c" >/dev/null
buildah config --entrypoint '["/usr/local/bin/entrypoint", "/sbin/init"]' --cmd '[]' \
	--stop-signal SIGRTMIN+3 --env container=podman \
	--label "org.opencontainers.image.title=mcpfleet-kind-node" \
	--label "org.opencontainers.image.description=kind node: Kubernetes $k8s built from hack/tools pins" "$c"
buildah commit --quiet --rm "$c" "$image" >/dev/null
ctrs=()
# Older node images (another hash) are no longer used: free their space.
for old in $(buildah images --noheading --format '{{.Name}}:{{.Tag}}' | grep '^localhost/mcpfleet-kind-node:' || true); do
	[[ "$old" == "$image" ]] || buildah rmi "$old" >/dev/null 2>&1 || true
done
rm -rf "$preload"
# Where a Docker engine answers (kind's default provider), the image goes there too.
# shellcheck source=hack/lib/engine.sh
source "$here/../lib/engine.sh"
if docker_engine_answers; then
	buildah push --quiet "$image" "docker-daemon:$image" >/dev/null
fi
log "made $image in $((SECONDS - start))s"
echo "kind node image: $image"
