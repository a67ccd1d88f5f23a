# syntax=docker/dockerfile:1
# headroom: the image the Helm chart runs (helm/headroom, image.tag defaults to the chart appVersion).
#
#   docker build -t ghcr.io/headroom-dev/headroom:0.1.0 .
#   docker run --rm -p 9880:9880 -v $PWD/headroom.yml:/etc/headroom/headroom.yml:ro \
#     ghcr.io/headroom-dev/headroom:0.1.0
#
# Two stages: the first builds the headroom wheel, the second installs it with every dependency from
# binary wheels (no compiler is installed anywhere) and runs as an unprivileged numeric user.

# Pinned base: Python 3.11 on Debian 12 "bookworm", slim variant. Bump deliberately.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# .dockerignore is an allow-list (pyproject.toml, README.md, monitor/), so this copies only those
COPY . .
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="headroom" \
      org.opencontainers.image.description="Live capacity monitor for LLM inference fleets (vLLM behind a gateway)" \
      org.opencontainers.image.source="https://github.com/headroom-dev/headroom" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    MPLCONFIGDIR=/tmp/matplotlib

# Unprivileged user with the uid/gid the chart's securityContext expects (65532, "nonroot").
RUN groupadd --system --gid 65532 headroom \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/headroom --no-create-home \
            --shell /usr/sbin/nologin headroom \
 && mkdir -p /etc/headroom /var/lib/headroom \
 && chown 65532:65532 /var/lib/headroom

# Install the wheel and its dependencies (binary wheels only, so nothing is compiled), then remove
# the packaging tools: the running image needs neither pip nor setuptools.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --only-binary=:all: /wheels/*.whl \
 && python -m pip uninstall --yes setuptools wheel pip \
 && headroom --help >/dev/null

USER 65532:65532
WORKDIR /var/lib/headroom
VOLUME ["/var/lib/headroom"]
EXPOSE 9880

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9880/-/healthy', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["headroom"]
CMD ["run", "--config.file=/etc/headroom/headroom.yml", "--web.listen-address=:9880"]
