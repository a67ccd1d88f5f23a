# headroom: the image the Helm chart runs (helm/headroom, image.tag defaults to the chart appVersion).
#
#   make image          # = bash image/build.sh: builds localhost/headroom:dev with buildah, no registry
#
# The build context is not the repository: image/build.sh assembles build/image/ with
#   wheels/            the runtime wheel of this repository (`pip wheel --no-deps .`: the `monitor`
#                      package only) and every dependency as a binary wheel, built on the host
#   constraints.txt    image/constraints.txt, every Python package pinned (regenerate: bash image/lock.sh)
# and BASE is a Debian bookworm root filesystem made by mmdebstrap from Debian packages (python3 3.11,
# its venv module, CA certificates), cached and imported by image/build.sh.
# Nothing is downloaded and nothing is compiled here: pip installs with --no-index from the wheels.

ARG BASE=localhost/headroom-base:bookworm
FROM ${BASE}
LABEL org.opencontainers.image.title="headroom" \
      org.opencontainers.image.description="Live capacity monitor for LLM inference fleets (vLLM behind a gateway)" \
      org.opencontainers.image.source="https://github.com/headroom-dev/headroom" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    PATH=/opt/headroom/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Unprivileged user with the uid/gid the chart's securityContext expects (65532, "nonroot").
RUN groupadd --system --gid 65532 headroom \
 && useradd --system -K SYS_UID_MAX=65532 --uid 65532 --gid 65532 --home-dir /var/lib/headroom --no-create-home \
            --shell /usr/sbin/nologin headroom \
 && mkdir -p /etc/headroom /var/lib/headroom \
 && chown 65532:65532 /var/lib/headroom

# One venv with headroom and its pinned dependencies (binary wheels only, no index). The test suites
# the numeric wheels ship (numpy/scipy/pandas/statsmodels/matplotlib `tests/` packages, ~130 MB, never
# imported at run time) are removed, the rest is byte-compiled now (the root filesystem is read-only at
# run time), and the packaging tools go: the running image needs neither pip nor setuptools.
RUN --mount=type=bind,source=.,target=/context \
    python3 -m venv /opt/headroom \
 && /opt/headroom/bin/pip install --quiet --no-index --only-binary=:all: --no-compile \
        --find-links /context/wheels --constraint /context/constraints.txt headroom \
 && /opt/headroom/bin/pip uninstall --yes --quiet setuptools pip \
 && find /opt/headroom/lib -depth -type d -name tests -prune -exec rm -rf {} + \
 && python3 -m compileall -q -j 0 /opt/headroom/lib >/dev/null \
 && headroom --help >/dev/null

USER 65532:65532
WORKDIR /var/lib/headroom
VOLUME ["/var/lib/headroom"]
EXPOSE 9880

# No HEALTHCHECK: Kubernetes ignores it; the chart's probes call /-/healthy and /-/ready.
ENTRYPOINT ["headroom"]
CMD ["run", "--config.file=/etc/headroom/headroom.yml", "--web.listen-address=:9880"]
