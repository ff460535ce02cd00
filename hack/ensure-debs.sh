#!/usr/bin/env bash
# Installs the Debian packages the fleet and its tests start for real
# (redis-server, redis-sentinel, prometheus/promtool), only where they are missing.
# Extra package names may be given, and three groups by name:
#   bench  what `make bench` starts besides the fleet (nginx, the baseline
#          proxy; wrk, the compiled load generator for the hot-path figures);
#   image  what `make image` needs without a Docker engine (buildah, runc,
#          mmdebstrap to make the base from the machine's own apt mirror);
#   node   what the node tier runs besides the built Kubernetes tools
#          (containerd, runc, the CNI plugins, iptables, iproute2);
#   kind   what a kind cluster needs where no Docker engine answers
#          (podman with the CNI plugins its bridge networks use; mmdebstrap
#          and buildah make the node image, hack/kind/).
# A Docker engine is there when `docker info` succeeds (hack/lib/engine.sh),
# never because a `docker` command is on the PATH.
#
# --optional (first): the packages are wanted, not needed (`make run`, whose
# `mcpfleet dev` falls back without redis-server). Where they cannot be
# installed (not root; apt-get failed) this says which and why, and exits 0.
# Without it, a package that cannot be installed fails the run.
set -euo pipefail
optional=0
if [ "${1:-}" = --optional ]; then
  optional=1
  shift
fi
# shellcheck source=hack/lib/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine.sh"
# Whether Debian's package is installed: `dpkg -s` also succeeds for a package
# that was removed but not purged ("deinstall ok config-files"), whose
# programs are gone.
installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}
# Where Debian's CNI plugin packages put their binaries.
cni="${MCPFLEET_CNI_PLUGIN_DIR:-/usr/lib/cni}"
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-sentinel >/dev/null || need+=(redis-sentinel)
command -v promtool >/dev/null || need+=(prometheus)
for pkg in "$@"; do
  case "$pkg" in
    # Groups look for the commands, not the package names: a machine with
    # Docker's containerd.io already has containerd and runc, and Debian's
    # packages would conflict with it.
    bench)
      pkgs=()
      command -v wrk >/dev/null || pkgs+=(wrk)
      command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || pkgs+=(nginx)
      ;;
    image)
      pkgs=()
      command -v buildah >/dev/null || pkgs+=(buildah)
      command -v runc >/dev/null || pkgs+=(runc)
      command -v mmdebstrap >/dev/null || pkgs+=(mmdebstrap)
      command -v newuidmap >/dev/null || pkgs+=(uidmap)
      ;;
    node)
      pkgs=()
      command -v containerd >/dev/null || pkgs+=(containerd)
      command -v runc >/dev/null || pkgs+=(runc)
      [ -x "$cni/bridge" ] || pkgs+=(containernetworking-plugins)
      command -v iptables >/dev/null || pkgs+=(iptables)
      command -v ip >/dev/null || pkgs+=(iproute2)
      command -v conntrack >/dev/null || pkgs+=(conntrack)
      ;;
    kind)
      pkgs=()
      if ! docker_engine_answers; then
        command -v podman >/dev/null || pkgs+=(podman)
        # podman's CNI networks resolve container names (kind's nodes find the
        # control plane by name) only with the dnsname plugin.
        [ -x "$cni/dnsname" ] || pkgs+=(golang-github-containernetworking-plugin-dnsname)
      fi
      [ -x "$cni/bridge" ] || pkgs+=(containernetworking-plugins)
      command -v iptables >/dev/null || pkgs+=(iptables)
      command -v buildah >/dev/null || pkgs+=(buildah)
      command -v mmdebstrap >/dev/null || pkgs+=(mmdebstrap)
      ;;
    *) pkgs=("$pkg") ;;
  esac
  for p in "${pkgs[@]}"; do
    installed "$p" || need+=("$p")
  done
done
# MCPFLEET_DEBS_DRY_RUN=1: print what would be installed (one line) and stop.
if [ "${MCPFLEET_DEBS_DRY_RUN:-0}" = 1 ]; then
  echo "would install: ${need[*]}"
  exit 0
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  if [ "$optional" = 1 ]; then
    echo "mcpfleet: cannot install ${need[*]}: installing Debian's packages needs root" \
      "(sudo apt-get install -y ${need[*]}); going on without them" >&2
    exit 0
  fi
  echo "mcpfleet: missing ${need[*]}; install with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "mcpfleet: installing ${need[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
  if [ "$optional" = 1 ]; then
    echo "mcpfleet: cannot install ${need[*]}: apt-get failed (above); going on without them" >&2
    exit 0
  fi
  exit 1
fi
