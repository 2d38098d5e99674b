# The connector as a sidecar image: `docker build -t acp-oauth-connector .`
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
USER connector
ENV CONNECTOR_CONFIG=/app/config/connector.toml \
    CONNECTOR_SERVER__HOST=0.0.0.0 \
    CONNECTOR_LOG_FORMAT=json
EXPOSE 8700
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8700/healthz', timeout=2)" || exit 1
ENTRYPOINT ["acp-connector"]
CMD ["serve"]
