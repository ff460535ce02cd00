#!/usr/bin/env bash
# Delete the kind cluster deploy/kind/up.sh made, and what it changed on the
# machine (make kind-down): its network, the host route to its Services, the
# CNI state podman kept for that network, iptables chains and mounts.
# Environment: KIND_CLUSTER (default mcpfleet). Exits non-zero, naming what it
# could not undo, when something is left behind.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
make -C "$root" --no-print-directory kind-down "KIND_CLUSTER=${KIND_CLUSTER:-mcpfleet}"
