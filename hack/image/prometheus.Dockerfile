# A Prometheus for the autoscaling e2e tier (KEDA's Prometheus triggers read it):
# Debian's prometheus package on the same base as the mcpfleet image
# (hack/image/autoscaling.sh passes BASE), run as UID 10001 with its data in
# /prometheus. Its configuration comes from a ConfigMap at run time.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG VERSION
LABEL org.opencontainers.image.title="mcpfleet-prometheus" \
      org.opencontainers.image.description="Debian's prometheus for mcpfleet's autoscaling tests" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/mcpfleet/mcpfleet"
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
WORKDIR /tmp
# The version is the Debian release's, fixed by the base's suite. Only the
# binary is taken from the package (it links libc alone): its web UI's
# JavaScript dependencies (about 270 MB) are not installed.
# hadolint ignore=DL3008
RUN apt-get update -qq; \
    apt-get download -qq prometheus; \
    dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x -C / ./usr/bin/prometheus; \
    rm -rf /tmp/prometheus_*.deb /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    mkdir -p /prometheus; \
    chown 10001:10001 /prometheus
USER 10001:10001
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
