#!/usr/bin/env bash
# The bases of the daemonless image build, made here instead of pulled (no
# registry needs to be reachable): prints "RUNTIME_BASE BUILD_BASE".
#
# - RUNTIME_BASE, localhost/mcpfleet-base:<suite>-<hash>: a Debian minbase root
#   filesystem with Debian's python3, made by mmdebstrap from the apt mirror
#   this machine already uses (hack/image/apt-sources.py reads it), without
#   docs, man pages or locales (dpkg path excludes, kept for later installs),
#   merged /usr, apt lists and caches removed;
# - BUILD_BASE, localhost/mcpfleet-build-base:<suite>-<hash>: the same plus
#   python3-venv (ensurepip), for the Dockerfile's build stage.
#
# <hash> covers this script and the mirror lines: the bases are made once and
# reused until either changes. Needs root (mmdebstrap --mode=root), mmdebstrap
# and buildah; hack/ensure-debs.sh image installs them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
suite="${IMAGE_SUITE:-bookworm}"
# shellcheck source=hack/image/containers-env.sh
source "$here/containers-env.sh"
# shellcheck source=hack/image/debian-rootfs.sh
source "$here/debian-rootfs.sh"
log() { echo "base: $*" >&2; }

mapfile -t mirrors < <(python3 "$here/apt-sources.py" "$suite")
hash="$( (cat "$0" "$here/debian-rootfs.sh"; printf '%s\n' "$suite" "${mirrors[@]}") | sha256sum | cut -c1-10)"
base="localhost/mcpfleet-base:$suite-$hash"
build_base="localhost/mcpfleet-build-base:$suite-$hash"

exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

if ! exists "$base"; then
	if ! command -v mmdebstrap >/dev/null; then
		log "mmdebstrap is not installed: bash hack/ensure-debs.sh image"
		exit 1
	fi
	start=$SECONDS
	tarball="$root/.cache/image/base-$suite-$hash.tar"
	log "making $base with mmdebstrap from: ${mirrors[*]}"
	debian_rootfs "$suite" python3 "$tarball" "$root/.cache/image/mmdebstrap.log" "${mirrors[@]}" || exit 1
	ctr="$(buildah from scratch)"
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	buildah add --quiet "$ctr" "$tarball" / >/dev/null
	buildah config --cmd '["/bin/bash"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--label "org.opencontainers.image.title=mcpfleet-base" \
		--label "org.opencontainers.image.description=Debian $suite minbase with Debian's python3" "$ctr"
	buildah commit --quiet --rm "$ctr" "$base" >/dev/null
	trap - EXIT
	rm -f "$tarball"
	log "made $base in $((SECONDS - start))s"
fi

if ! exists "$build_base"; then
	start=$SECONDS
	# No CA mount here: apt fetches over the mirror's own scheme and verifies
	# with the Debian keyring, and ca-certificates' postinst must write the bundle.
	ctr="$(buildah from --pull-never "$base")"
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	buildah run --network host "$ctr" -- sh -euc \
		'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*' >&2
	buildah commit --quiet --rm "$ctr" "$build_base" >/dev/null
	trap - EXIT
	log "made $build_base in $((SECONDS - start))s"
fi
# Older bases (another hash) are no longer used by anything: free their space.
for old in $(buildah images --noheading --format '{{.Name}}:{{.Tag}}' | grep -E '^localhost/mcpfleet-(build-)?base:' || true); do
	if [[ "$old" != "$base" && "$old" != "$build_base" ]]; then
		buildah rmi "$old" >/dev/null 2>&1 || true
	fi
done
echo "$base $build_base"
