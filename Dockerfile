# mcpfleet: one image for the replica (`mcpfleet serve`), the router
# (`mcpfleet router`) and the key ring operator (`mcpfleet operator`).
#
# Two stages: the build stage makes a virtual environment in /opt/mcpfleet and
# installs the project into it; the final stage copies only that venv onto the
# runtime base, so no pip, wheel or compiler reaches the image.
#
# BASE is the runtime base, BUILD_BASE the same Python plus the `venv` module
# (ensurepip). They must put the same Python at the same path: the venv's
# interpreter is a symlink to it. Where Docker runs, both default to the
# official python:3.11-slim. Without Docker, `make image` (hack/image/build.sh)
# makes a Debian bookworm minbase root filesystem with Debian's python3 from the
# apt mirror this machine already uses, and passes both.
ARG BASE=python:3.11-slim
ARG BUILD_BASE=${BASE}

FROM ${BUILD_BASE} AS build
SHELL ["/bin/sh", "-eu", "-c"]
RUN python3 -m venv /opt/mcpfleet
WORKDIR /src
COPY pyproject.toml README.md ./
# The locked dependency set, with hashes (hack/lock/update.sh): the image
# installs exactly what the project tested, then the project without deps.
# LOCK names the set: runtime (the default: the mcpfleet image), or
# runtime-tasks for the image of apps with MCP tasks (`make image-tasks`,
# tagged <version>-tasks): FastMCP's tasks engine and the FastMCP it was
# published for (docs/tasks.md says why that is not the default's FastMCP).
ARG LOCK=runtime
COPY hack/lock/${LOCK}.txt ./hack/lock/${LOCK}.txt
COPY server ./server
COPY operator ./operator
# pip trusts the system CA bundle where there is one: a build behind a
# TLS-inspecting proxy mounts the host's bundle here read-only (hack/image/build.sh
# does); it is a build-time mount and never part of a layer.
# The lock lists every dependency (uv resolved them), so pip resolves nothing
# (--no-deps): Debian bookworm's pip 23.0 mis-resolves a dependency's extras
# under --require-hashes (pydocket's py-key-value-aio[memory,redis] in the
# tasks set: it fetched an unpinned newer version and stopped). `pip check`
# then proves the installed set complete and consistent. Two distributions
# come from the source: mcpfleet (pyproject.toml) and the example apps beside it,
# mcpfleet-examples (server/pyproject.toml), which the chart's default server.app
# (mcpfleet_examples.app:app) and its `helm test` serve.
RUN if [ -f /etc/ssl/certs/ca-certificates.crt ]; then \
        export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    fi; \
    /opt/mcpfleet/bin/pip install --no-cache-dir --require-hashes --no-deps -r "hack/lock/${LOCK}.txt" ; \
    /opt/mcpfleet/bin/pip install --no-cache-dir --no-deps . ./server ; \
    /opt/mcpfleet/bin/pip check ; \
    /opt/mcpfleet/bin/pip uninstall --yes pip ; \
    rm -f /opt/mcpfleet/bin/activate* /opt/mcpfleet/bin/Activate.ps1

FROM ${BASE}
# The image's version label: hack/image/build.sh passes pyproject.toml's version.
ARG VERSION
ARG REVISION=unknown
LABEL org.opencontainers.image.title="mcpfleet" \
      org.opencontainers.image.description="FastMCP servers whose tools ask for input, horizontally scaled on Kubernetes: replica, router and operator in one image" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/mcpfleet/mcpfleet"
COPY --from=build /opt/mcpfleet /opt/mcpfleet
# The .pyc files were compiled in the build stage (start-up imports fastmcp and
# mcp); none are written at run time.
ENV PATH=/opt/mcpfleet/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A numeric UID/GID with no entry in /etc/passwd: Kubernetes' runAsNonRoot can
# verify a numeric USER, and nothing in the image needs a home directory.
USER 10001:10001
EXPOSE 8000 8001
ENTRYPOINT ["mcpfleet"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8001", "--keys", "/etc/mcpfleet/keys"]
