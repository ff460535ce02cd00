# Sourced by every script that chooses between a Docker engine and the
# daemonless tools (hack/ensure-debs.sh, hack/image/builder.sh,
# hack/kind/node-image.sh). One rule: a Docker engine is there when
# `docker info` succeeds. A `docker` command on the PATH proves nothing (some
# machines ship the client with no engine behind it). The Python side
# (the kind provider's engine()) follows the same rule.
#
# MCPFLEET_DOCKER_INFO_TIMEOUT bounds the probe (seconds, default 20): a
# client pointed at an engine that does not answer must not hang a build.
docker_engine_answers() {
	command -v docker >/dev/null 2>&1 || return 1
	timeout "${MCPFLEET_DOCKER_INFO_TIMEOUT:-20}" docker info >/dev/null 2>&1
}
