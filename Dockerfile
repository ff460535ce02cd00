# mcpfleet: one image for the replica (`mcpfleet serve`), the router
# (`mcpfleet router`) and, later, the operator.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin mcpfleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Never put the working directory on sys.path.
ENV PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
USER 10001
EXPOSE 8000 8001
ENTRYPOINT ["mcpfleet"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8001", "--keys", "/etc/mcpfleet/keys"]
