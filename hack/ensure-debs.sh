#!/usr/bin/env bash
# Installs the Debian packages the fleet and its tests start for real
# (redis-server, prometheus/promtool), only where they are missing.
# Extra package names may be given (make bench adds nginx, its baseline proxy).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v promtool >/dev/null || need+=(prometheus)
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "mcpfleet: missing ${need[*]}; install with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "mcpfleet: installing ${need[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
