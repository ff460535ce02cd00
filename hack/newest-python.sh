#!/usr/bin/env bash
# The newest CPython this machine can run that pyproject.toml's requires-python
# allows (3.11 or later), for the drift run (make test-latest):
#   bash hack/newest-python.sh [FALLBACK]
# Candidates are the python3.N commands on the PATH and pyenv's installed
# versions; a candidate counts only when it runs (a pyenv shim of a version
# pyenv has not selected does not). Prints the newest one's path, else FALLBACK
# (python3). Nothing is installed: Debian's own python3 is the fallback.
set -euo pipefail
fallback="${1:-python3}"
candidates=()
for minor in $(seq 20 -1 11); do
  if command -v "python3.$minor" >/dev/null; then
    candidates+=("$(command -v "python3.$minor")")
  fi
  if command -v pyenv >/dev/null; then
    root="$(pyenv root)"
    # The newest patch release pyenv has of 3.<minor> (final releases only).
    for dir in $(ls -d "$root"/versions/3."$minor".* 2>/dev/null | grep -E '/3\.[0-9]+\.[0-9]+$' | sort -V -r); do
      candidates+=("$dir/bin/python3.$minor")
    done
  fi
done
for python in "${candidates[@]}"; do
  # Runs, and is the CPython its name says (a shim may name another).
  if "$python" -c 'import sys; sys.exit(not (sys.version_info >= (3, 11) and sys.implementation.name == "cpython"))' 2>/dev/null; then
    echo "$python"
    exit 0
  fi
done
echo "$fallback"
