#!/usr/bin/env bash
# The images of the autoscaling e2e tier (docs/autoscaling.md): `make
# autoscaling-images` runs this.
#
#   localhost/mcpfleet-keda:<keda version>  KEDA's operator and metrics API server,
#                                           built from the pin in hack/tools/keda
#   localhost/mcpfleet-prometheus:<tag>     Debian's prometheus (KEDA's triggers read it)
#
#   bash hack/image/autoscaling.sh             # both, and their archives
#   bash hack/image/autoscaling.sh --prebuild  # only KEDA's binaries, in the background
#
# Each written as a docker-archive into .cache/image/ (what `kind load
# image-archive` reads); the last two lines of output name the archives. KEDA's
# binaries come from hack/tools/build.sh into .cache/bin (the Go build cache makes
# a rebuild cheap; a cold one is the longest step of a cold CI run,
# docs/testing.md). Daemonless (buildah on the base hack/image/base.sh makes), or
# docker where an engine answers.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
log() { echo "autoscaling-images: $*" >&2; }

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
tag="${IMAGE_TAG:-$version}"
keda="$(sed -n 's|^[[:space:]]*github.com/kedacore/keda/v2 \(v[^ ]*\).*|\1|p' hack/tools/keda/go.mod)"
bin="$root/.cache/bin"
out="$root/.cache/image"
mkdir -p "$out"

# KEDA's binaries are built under a lock: `--prebuild` starts the build in the
# background at nice 19 (make test does, before the process tiers, which leave
# the cores idle most of the time: on a cold machine the build, over ten
# minutes, then costs the run little) and returns; a build that follows waits
# for it, then finds the binaries up to date.
lock="$bin/.keda.lock"
mkdir -p "$bin"
if [[ "${1:-}" == --prebuild ]]; then
	log "building KEDA $keda in the background (nice 19): $bin/.keda-build.log"
	(flock 9 && nice -n 19 bash hack/tools/build.sh "$bin" keda-operator keda-adapter) \
		9>"$lock" >"$bin/.keda-build.log" 2>&1 &
	exit 0
fi
start=$SECONDS
(flock 9 && bash hack/tools/build.sh "$bin" keda-operator keda-adapter) 9>"$lock"
log "KEDA $keda binaries ready in $((SECONDS - start))s"

# The build context of the KEDA image: only its two binaries (hard links, no copy).
context="$(mktemp -d "$out/keda-context.XXXXXX")"
trap 'rm -rf "$context"' EXIT
ln -f "$bin/keda-operator" "$bin/keda-adapter" "$context/" 2>/dev/null ||
	cp "$bin/keda-operator" "$bin/keda-adapter" "$context/"

keda_image="localhost/mcpfleet-keda:$keda"
keda_archive="$out/mcpfleet-keda-$keda.tar"
prom_image="localhost/mcpfleet-prometheus:$tag"
prom_archive="$out/mcpfleet-prometheus-$tag.tar"

# shellcheck source=hack/image/builder.sh
source "$here/builder.sh"
if [[ "$(image_builder)" == docker ]]; then
	docker build --build-arg "VERSION=$keda" -t "$keda_image" -f hack/image/keda.Dockerfile "$context" >&2
	docker build --build-arg "VERSION=$version" -t "$prom_image" -f hack/image/prometheus.Dockerfile hack/image >&2
	docker save -o "$keda_archive" "$keda_image"
	docker save -o "$prom_archive" "$prom_image"
else
	# shellcheck source=hack/image/containers-env.sh
	source "$here/containers-env.sh"
	read -r base _ < <(bash "$here/base.sh")
	buildah build --format docker --layers --network host \
		--build-arg "BASE=$base" --build-arg "VERSION=$keda" \
		-t "$keda_image" -f hack/image/keda.Dockerfile "$context" >&2
	buildah build --format docker --layers --network host \
		--build-arg "BASE=$base" --build-arg "VERSION=$version" \
		-t "$prom_image" -f hack/image/prometheus.Dockerfile hack/image >&2
	# An archive is written again only when its image changed (each is hundreds of MB).
	for pair in "$keda_image|$keda_archive" "$prom_image|$prom_archive"; do
		IFS='|' read -r image archive <<<"$pair"
		id="$(buildah inspect --type image -f '{{.FromImageID}}' "$image")"
		if [[ -f "$archive" && "$(cat "$archive.id" 2>/dev/null)" == "$id" ]]; then
			continue
		fi
		rm -f "$archive" "$archive.id"
		buildah push --quiet "$image" "docker-archive:$archive:$image" >/dev/null
		echo "$id" >"$archive.id"
	done
fi
log "built in $((SECONDS - start))s: $keda_archive ($(du -h "$keda_archive" | cut -f1)), $prom_archive ($(du -h "$prom_archive" | cut -f1))"
echo "$keda_archive"
echo "$prom_archive"
