# Sourced by the image builds (hack/image/build.sh, deploy/own-app/build.sh):
# which builder, and what a buildah build mounts.
#
# shellcheck source=hack/lib/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/engine.sh"

# image_builder: prints $IMAGE_BUILDER if set, else docker when a Docker engine
# answers, else buildah.
image_builder() {
	if [[ -n "${IMAGE_BUILDER:-}" ]]; then
		echo "$IMAGE_BUILDER"
	elif docker_engine_answers; then
		echo docker
	else
		echo buildah
	fi
}

# buildah_ca_mount: the host's CA bundle, read-only, for the build's RUN steps
# (pip verifies the package index with it); never copied into a layer. Sets
# the array CA_MOUNT (empty where the host has no bundle).
buildah_ca_mount() {
	CA_MOUNT=()
	if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
		CA_MOUNT=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
	fi
}
