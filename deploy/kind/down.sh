#!/usr/bin/env bash
# Delete the kind cluster deploy/kind/up.sh made (CLUSTER, default mcpfleet).
set -euo pipefail
kind delete cluster --name "${CLUSTER:-mcpfleet}"
