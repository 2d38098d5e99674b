# The connector as a sidecar image: `docker build -t acp-oauth-connector .` (.dockerignore keeps the context to
# what is copied here). Checked without a Docker engine by tests/test_docker_image.py: hadolint, and these layers
# built with pip in a throwaway virtualenv, served, and probed with the HEALTHCHECK below.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /app connector
WORKDIR /app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY config ./config
USER 10001
# CONNECTOR_SERVER__PORT is the listening port (it wins over the config file); the health check reads it.
ENV CONNECTOR_CONFIG=/app/config/connector.toml \
    CONNECTOR_SERVER__HOST=0.0.0.0 \
    CONNECTOR_SERVER__PORT=8700 \
    CONNECTOR_LOG_FORMAT=json
EXPOSE 8700
HEALTHCHECK --interval=10s --timeout=3s CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['CONNECTOR_SERVER__PORT'] + '/healthz', timeout=2)"]
ENTRYPOINT ["acp-connector"]
CMD ["serve"]
