#!/usr/bin/env bash
# Build the image of the example own app (this folder) on top of the mcpfleet
# image that `make image` built:
#
#   bash deploy/own-app/build.sh localhost/ownapp:1
#
# With a Docker engine that answers, `docker build` (BUILD_BASE defaults to
# python:3.11-slim, the mcpfleet image's base there). Without one, buildah,
# with the build base `make image` made (hack/image/base.sh): the same Python
# as the mcpfleet image's, plus ensurepip. The last line names the image.
#
# Environment: MCPFLEET_IMAGE (default localhost/mcpfleet:<version>; with
# buildah, .cache/image/mcpfleet-<version>.tar when `make image` wrote it),
# IMAGE_BUILDER=docker|buildah (default: docker when it answers).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
image="${1:?usage: build.sh IMAGE (e.g. localhost/ownapp:1)}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)"
mcpfleet="${MCPFLEET_IMAGE:-localhost/mcpfleet:$version}"
# buildah: by default the archive `make image` wrote in this tree, the very
# image the local node runs (the name in the shared local store may have been
# retagged by a build elsewhere on the machine since).
archive="$root/.cache/image/mcpfleet-$version.tar"

# shellcheck source=hack/image/builder.sh
source "$root/hack/image/builder.sh"
builder="$(image_builder)"

if [[ "$builder" == docker ]]; then
	docker build --build-arg "MCPFLEET_IMAGE=$mcpfleet" -t "$image" "$here" >&2
	echo "$image"
	exit 0
fi

# shellcheck source=hack/image/containers-env.sh
source "$root/hack/image/containers-env.sh"
if [[ -z "${MCPFLEET_IMAGE:-}" && -f "$archive" ]]; then
	mcpfleet="docker-archive:$archive"
elif ! buildah inspect --type image "$mcpfleet" >/dev/null 2>&1; then
	echo "own-app: no image $mcpfleet here: make image" >&2
	exit 1
fi
read -r _ build_base < <(bash "$root/hack/image/base.sh")
buildah_ca_mount
# buildah (1.28) leaves a working container behind for a stage that only
# COPY --from reads (here the mcpfleet stage): remove the ones this build made.
before="$(buildah containers --quiet --notruncate | sort)"
remove_new() {
	comm -13 <(echo "$before") <(buildah containers --quiet --notruncate | sort) |
		xargs -r buildah rm >/dev/null 2>&1 || true
}
trap remove_new EXIT
buildah build --format docker --layers --network host --pull=never "${CA_MOUNT[@]}" \
	--build-arg "MCPFLEET_IMAGE=$mcpfleet" --build-arg "BUILD_BASE=$build_base" \
	-t "$image" -f "$here/Dockerfile" "$here" >&2
echo "$image"
