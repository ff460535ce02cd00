#!/usr/bin/env bash
# Build the mcpfleet image: `make image` runs this.
#
#   bash hack/image/build.sh            # -> localhost/mcpfleet:<version>
#   bash hack/image/build.sh --tasks    # -> localhost/mcpfleet:<version>-tasks
#
# --tasks (`make image-tasks`) builds the image for apps with MCP tasks: the
# same Dockerfile with LOCK=runtime-tasks (hack/lock/runtime-tasks.txt:
# FastMCP's tasks engine and the FastMCP it was published for; docs/tasks.md),
# its archive .cache/image/mcpfleet-<tag>-tasks.tar; the pause and Redis images
# are the default build's and are not made again.
#
# With a Docker engine that answers, `docker build` with the Dockerfile's
# defaults (python:3.11-slim). Without one (this project's CI machines), the
# daemonless path: buildah builds the same Dockerfile on a base made here by
# hack/image/base.sh (Debian bookworm minbase + Debian's python3, from the apt
# mirror the machine already uses), cached between runs.
#
# Writes .cache/image/mcpfleet-<tag>.tar (a docker-archive that `docker load`,
# `ctr images import` and `kind load image-archive` read) and, on the buildah
# path, the CRI sandbox ("pause") image the node tier's containerd needs,
# .cache/image/mcpfleet-pause-<tag>.tar, and the chart's Redis image
# (hack/image/redis.Dockerfile: Debian's redis-server on the same base),
# .cache/image/mcpfleet-redis-<tag>.tar. The last line of output names the
# image: `localhost/mcpfleet:<tag>`.
#
# Environment: IMAGE_TAG (default: the version in pyproject.toml),
# IMAGE_BUILDER=docker|buildah (default: docker when it answers, else buildah).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
tag="${IMAGE_TAG:-$version}"
lock=runtime
case "${1:-}" in
"") ;;
--tasks)
	lock=runtime-tasks
	tag="$tag-tasks"
	;;
*)
	echo "usage: bash hack/image/build.sh [--tasks]" >&2
	exit 2
	;;
esac
image="localhost/mcpfleet:$tag"
out="$root/.cache/image"
mkdir -p "$out"
archive="$out/mcpfleet-$tag.tar"
# The chart's built-in Redis: Debian's redis-server on the same base.
redis_image="localhost/mcpfleet-redis:$tag"
redis_archive="$out/mcpfleet-redis-$tag.tar"
revision="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
log() { echo "image: $*" >&2; }

# shellcheck source=hack/image/builder.sh
source "$here/builder.sh"
builder="$(image_builder)"

start=$SECONDS
if [[ "$builder" == docker ]]; then
	log "building $image with docker (base python:3.11-slim, hack/lock/$lock.txt)"
	docker build --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
		--build-arg "LOCK=$lock" -t "$image" . >&2
	docker save -o "$archive" "$image"
	if [[ "$lock" != runtime ]]; then
		log "built in $((SECONDS - start))s; archive $archive"
		echo "$image"
		exit 0
	fi
	docker build --build-arg "VERSION=$version" -t "$redis_image" -f hack/image/redis.Dockerfile hack/image >&2
	docker save -o "$redis_archive" "$redis_image"
	log "built in $((SECONDS - start))s; $(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec) ; archive $archive"
	echo "$image"
	exit 0
fi

if ! command -v buildah >/dev/null; then
	echo "image: no Docker engine and no buildah: run 'bash hack/ensure-debs.sh image' (root) or install buildah" >&2
	exit 1
fi
# shellcheck source=hack/image/containers-env.sh
source "$here/containers-env.sh"

# The bases: made once, kept while hack/image/base.sh and the mirror are unchanged.
read -r base build_base < <(bash "$here/base.sh")

log "building $image with buildah on $base (hack/lock/$lock.txt)"
previous="$(buildah inspect --type image -f '{{.FromImageID}}' "$image" 2>/dev/null || true)"
# The host's CA bundle is mounted read-only into RUN steps (pip trusts it); a
# build-time mount is no part of any layer.
buildah_ca_mount
buildah build --format docker --layers --network host "${CA_MOUNT[@]}" \
	--build-arg "BASE=$base" --build-arg "BUILD_BASE=$build_base" \
	--build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "LOCK=$lock" \
	-t "$image" -f Dockerfile . >&2
built=$((SECONDS - start))
# The image this build replaced would stay as an untagged copy: free its space.
current="$(buildah inspect --type image -f '{{.FromImageID}}' "$image")"
if [[ -n "$previous" && "$previous" != "$current" ]]; then
	buildah rmi "$previous" >/dev/null 2>&1 || true
fi

graphroot="$(buildah info --format '{{.store.GraphRoot}}')"
bytes_of() { python3 "$here/layer-bytes.py" "$graphroot" "$(buildah inspect --type image -f '{{.FromImageID}}' "$1")"; }
if [[ "$lock" != runtime ]]; then
	rm -f "$archive"
	buildah push --quiet "$image" "docker-archive:$archive:$image" >/dev/null
	log "built in ${built}s (image $(numfmt --to=iec "$(bytes_of "$image")")); archive $archive ($(du -h "$archive" | cut -f1))"
	echo "$image"
	exit 0
fi

# The CRI sandbox image: the runtime base whose entrypoint blocks. It shares
# every layer with the base, so it costs one small config layer.
pause="localhost/mcpfleet-pause:$tag"
if ! buildah inspect --type image "$pause" >/dev/null 2>&1 ||
	[[ "$(buildah inspect --type image -f '{{index .ImageAnnotations "mcpfleet.dev/base"}}' "$pause" 2>/dev/null)" != "$base" ]]; then
	ctr="$(buildah from --pull-never "$base")"
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	buildah config --entrypoint '["/bin/sleep"]' --cmd '["infinity"]' --user 65535:65535 \
		--annotation "mcpfleet.dev/base=$base" "$ctr"
	buildah commit --quiet --rm "$ctr" "$pause" >/dev/null
	trap - EXIT
fi

# The Redis image: one apt layer on the base, cached by buildah's --layers.
buildah build --format docker --layers --network host \
	--build-arg "BASE=$base" --build-arg "VERSION=$version" \
	-t "$redis_image" -f hack/image/redis.Dockerfile hack/image >&2

rm -f "$archive" "$out/mcpfleet-pause-$tag.tar" "$redis_archive"
buildah push --quiet "$image" "docker-archive:$archive:$image" >/dev/null
buildah push --quiet "$pause" "docker-archive:$out/mcpfleet-pause-$tag.tar:$pause" >/dev/null
buildah push --quiet "$redis_image" "docker-archive:$redis_archive:$redis_image" >/dev/null

base_bytes="$(bytes_of "$base")"
image_bytes="$(bytes_of "$image")"
log "built in ${built}s (base $(numfmt --to=iec "$base_bytes"), image $(numfmt --to=iec "$image_bytes"):" \
	"the mcpfleet layers add $(numfmt --to=iec $((image_bytes - base_bytes))))"
log "archives: $archive ($(du -h "$archive" | cut -f1)), $out/mcpfleet-pause-$tag.tar, $redis_archive ($(du -h "$redis_archive" | cut -f1))"
echo "$image"
