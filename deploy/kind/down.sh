#!/usr/bin/env bash
# Delete the kind cluster deploy/kind/up.sh made, and what it changed on the
# machine (make kind-down).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
make -C "$root" --no-print-directory kind-down
