# The chart's built-in Redis: Debian's redis-server package on the same base
# as the mcpfleet image (hack/image/build.sh passes BASE; where Docker runs,
# Debian's own bookworm-slim). The chart runs it as UID 10001 with a
# read-only root filesystem and its data in /data.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# The image's version label: hack/image/build.sh passes pyproject.toml's version.
ARG VERSION
LABEL org.opencontainers.image.title="mcpfleet-redis" \
      org.opencontainers.image.description="Debian's redis-server for the mcpfleet chart's built-in Redis" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="BSD-3-Clause" \
      org.opencontainers.image.source="https://github.com/mcpfleet/mcpfleet"
SHELL ["/bin/sh", "-eu", "-c"]
# The version is the Debian release's (bookworm's redis-server with its
# security updates), fixed by the base's suite rather than pinned here.
# hadolint ignore=DL3008
RUN apt-get update -qq; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/log/*.log /etc/redis/redis.conf; \
    mkdir -p /data; \
    chown 10001:10001 /data
USER 10001:10001
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["redis-server"]
CMD ["--bind", "*", "--protected-mode", "no", "--dir", "/data"]
