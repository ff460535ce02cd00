#!/usr/bin/env bash
# The exact Python dependency set, with hashes, that the image, `make` and
# .ci/run install from (`make lock` runs this; commit both files it writes):
#
#   hack/lock/runtime.txt   pyproject's dependencies and the [operator] and
#                           [tracing] extras: what the image installs (Dockerfile)
#   hack/lock/dev.txt       the [test] extra on top: the developer's and CI's venv
#   hack/lock/tasks.txt     the [test] and [tasks] extras: the venv of the tasks
#                           tests (make venv-tasks; .venv-tasks), whose FastMCP is
#                           the newest that has a published tasks engine
#   hack/lock/runtime-tasks.txt  the [operator], [tasks] and [tracing] extras: what the
#                           image for apps with MCP tasks installs (make
#                           image-tasks; the Dockerfile's LOCK=runtime-tasks)
#
# The ranges in pyproject.toml stay as they are, for people who `pip install
# mcpfleet` into their own app; the locks pin what this project ships and tests.
# Each file's first line records the sha256 of pyproject.toml's dependency
# tables it was made from: tests/unit/test_lock.py fails when they disagree.
# UPGRADE=1 moves every pin to the newest version the ranges allow; without
# it, pins already in the lock are kept where they still satisfy pyproject.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
uv="${UV:-$root/.venv/bin/uv}"
[[ -x "$uv" ]] || uv="$(command -v uv)"
digest="$("$root/.venv/bin/python" hack/lock/deps_digest.py)"
upgrade=()
[[ "${UPGRADE:-0}" == 1 ]] && upgrade=(--upgrade)
for spec in "runtime:operator,tracing" "dev:test" "tasks:test,tasks" "runtime-tasks:operator,tasks,tracing"; do
	name="${spec%%:*}"
	extras=()
	IFS=, read -ra names <<<"${spec#*:}"
	for extra in "${names[@]}"; do extras+=(--extra "$extra"); done
	out="hack/lock/$name.txt"
	tmp="$(mktemp)"
	# The lock being replaced is the starting point (no --upgrade: pins kept);
	# a new tasks lock starts from dev.txt's pins, so the two differ only where
	# the tasks engine needs it (FastMCP and what comes with it); a new
	# runtime-tasks lock starts from tasks.txt's, so the tasks image runs the
	# versions the tasks tests ran (tests/unit/test_lock.py checks it).
	if [[ -f "$out" ]]; then
		tail -n +2 "$out" >"$tmp"
	elif [[ "$name" == tasks ]]; then
		tail -n +2 hack/lock/dev.txt >"$tmp"
	elif [[ "$name" == runtime-tasks ]]; then
		tail -n +2 hack/lock/tasks.txt >"$tmp"
	fi
	"$uv" pip compile pyproject.toml "${extras[@]}" --generate-hashes --python-version 3.11 \
		--universal --no-header --quiet "${upgrade[@]}" -o "$tmp"
	{
		echo "# pyproject-deps-sha256: $digest (hack/lock/update.sh; make lock)"
		cat "$tmp"
	} >"$out"
	rm -f "$tmp"
	echo "lock: $out ($(grep -c '==' "$out") pins)"
done
