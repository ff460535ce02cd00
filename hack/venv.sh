#!/usr/bin/env bash
# Makes the virtual environment VENV with PYTHON's own venv module:
#   bash hack/venv.sh [PYTHON] [VENV]
# On Debian that module needs the python3-venv package (ensurepip and the pip
# it installs). Where it is missing: root installs it from Debian's packages;
# a normal user with virtualenv installed gets a virtualenv (which brings its
# own pip); anyone else is told to install python3-venv, and the venv is not
# made, since without it nothing puts pip in the venv short of downloading one.
set -euo pipefail
python="${1:-python3}"
venv="${2:-.venv}"
if err="$("$python" -m venv "$venv" 2>&1)"; then
  exit 0
fi
rm -rf "$venv"
case "$err" in
  *ensurepip*) ;;
  *) echo "$err" >&2; exit 1 ;;
esac
# Debian's python3-venv is the default python3's; another python3.X has its own.
version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
pkg=python3-venv
if [ "$("python3" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$version" ]; then
  pkg="python${version}-venv"
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "mcpfleet: $python -m venv needs $pkg: installing it from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
  exec "$python" -m venv "$venv"
fi
if command -v virtualenv >/dev/null; then
  echo "mcpfleet: $python -m venv needs $pkg (not installed): using virtualenv" >&2
  exec virtualenv -q -p "$python" "$venv"
fi
echo "mcpfleet: $python -m venv needs Debian's $pkg, and installing it needs root:" \
  "sudo apt-get install -y $pkg (then make again)" >&2
exit 1
