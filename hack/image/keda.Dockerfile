# KEDA's operator and metrics API server (docs/autoscaling.md), built here from
# the pin in hack/tools/keda (hack/tools/build.sh), on the same base as the
# mcpfleet image. hack/image/autoscaling.sh passes BASE and the directory with
# the two binaries as the context. Both are static Go binaries: the base adds
# only CA certificates and /etc/passwd. KEDA's manifests run them as
# /keda and /keda-adapter with runAsNonRoot: the user is numeric.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG VERSION
LABEL org.opencontainers.image.title="mcpfleet-keda" \
      org.opencontainers.image.description="KEDA's operator and metrics API server, built from source for mcpfleet's tests" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kedacore/keda"
COPY keda-operator /keda
COPY keda-adapter /keda-adapter
USER 10001:10001
ENTRYPOINT ["/keda"]
