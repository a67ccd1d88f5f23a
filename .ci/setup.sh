#!/usr/bin/env bash
# Everything the test tiers need beyond headroom's own venv, installed when missing (idempotent).
#
#   bash .ci/setup.sh live     the real binaries: Prometheus, promtool, Alertmanager, VictoriaMetrics,
#                              Chromium, wrk, openssl (Debian packages) and the npm models of the
#                              Prometheus Operator CRDs (chart tests)
#   bash .ci/setup.sh engine   the vLLM CPU engine and the LiteLLM proxy in front of it (own venvs)
#   bash .ci/setup.sh image    the container tools (podman, buildah, mmdebstrap, runc: Debian packages)
#                              and the podman settings these machines need (image/containers.conf,
#                              installed as /etc/containers/containers.conf.d/50-headroom.conf)
#   bash .ci/setup.sh all      all three; several may be given (bash .ci/setup.sh live image)
#
# Where something is missing and cannot be installed here (not root, no apt-get, no npm), it stops
# with one message naming what is missing and the command that installs it, and exits 1.
# The venvs live outside the clone (HEADROOM_VLLM_VENV, HEADROOM_LITELLM_VENV; the Makefile sets
# them under ~/.cache/headroom), so every clone on a machine shares them.
set -euo pipefail
cd "$(dirname "$0")/.."
want_live="" want_engine="" want_image=""
for what in "${@:-all}"; do
    case "$what" in
        live) want_live=1 ;; engine) want_engine=1 ;; image) want_image=1 ;;
        all) want_live=1 want_engine=1 want_image=1 ;;
        *) echo "usage: $0 live|engine|image|all..." >&2; exit 2 ;;
    esac
done
what="${*:-all}"
start=$(date +%s)
say() { echo "[setup +$(( $(date +%s) - start ))s] $*"; }

# binary -> Debian package
declare -A DEBIAN=(
    [prometheus]=prometheus [promtool]=prometheus [prometheus-alertmanager]=prometheus-alertmanager
    [victoria-metrics]=victoria-metrics [chromium]=chromium [wrk]=wrk [openssl]=openssl [curl]=curl
    [npm]=npm [node]=nodejs [faketime]=faketime
)
# the image tier: build (image/build.sh) and run (tests/deploy/test_image.py) the container image
declare -A IMAGE_DEBIAN=([podman]=podman [buildah]=buildah [mmdebstrap]=mmdebstrap [runc]=runc)
missing_pkgs=() missing_image=()
if [ -n "$want_live" ]; then
    for bin in "${!DEBIAN[@]}"; do
        command -v "$bin" >/dev/null 2>&1 || missing_pkgs+=("${DEBIAN[$bin]}")
    done
    [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing_pkgs+=(fonts-dejavu-core)
fi
if [ -n "$want_image" ]; then
    for bin in "${!IMAGE_DEBIAN[@]}"; do
        command -v "$bin" >/dev/null 2>&1 || missing_image+=("${IMAGE_DEBIAN[$bin]}")
    done
fi
python3 -c "import venv, ensurepip" 2>/dev/null || missing_pkgs+=(python3-venv)

if [ ${#missing_pkgs[@]} -gt 0 ] || [ ${#missing_image[@]} -gt 0 ]; then
    pkgs=$(printf '%s\n' "${missing_pkgs[@]}" "${missing_image[@]}" | grep . | sort -u | tr '\n' ' ')
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "apt-get install $pkgs"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        if [ ${#missing_pkgs[@]} -gt 0 ]; then
            apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}" ca-certificates >/dev/null
        fi
        # the container tools with their recommends (netavark, fuse-overlayfs, uidmap...): the set
        # the image tier was proven with (about 10 s)
        if [ ${#missing_image[@]} -gt 0 ]; then
            apt-get install -y -qq "${missing_image[@]}" >/dev/null
        fi
        # the Debian packages start their services; the tests start their own on free ports
        pkill -x prometheus 2>/dev/null || true
        pkill -f prometheus-alertmanager 2>/dev/null || true
        pkill -x victoria-metrics 2>/dev/null || true
    else
        echo "setup: missing $pkgs(the $what tier needs them); install with: sudo apt-get install -y $pkgs" >&2
        exit 1
    fi
fi

if [ -n "$want_image" ]; then
    # crun fails here (setrlimit, cgroups in hybrid mode): runc, and no raised open-files limit. The
    # scripts name image/containers.conf themselves (CONTAINERS_CONF); this makes a podman typed by
    # hand behave the same. Harmless where crun works.
    dropin=/etc/containers/containers.conf.d/50-headroom.conf
    if ! cmp -s image/containers.conf "$dropin" 2>/dev/null; then
        if [ "$(id -u)" = 0 ]; then
            say "podman settings: $dropin"
            mkdir -p "$(dirname "$dropin")" && cp image/containers.conf "$dropin"
        else
            say "podman settings: not root, so $dropin is not installed (the scripts use CONTAINERS_CONF=image/containers.conf)"
        fi
    fi
fi

if [ -n "$want_live" ]; then
    lock=tests/k8s-models/package-lock.json stamp=tests/k8s-models/node_modules/.package-lock.json
    if [ ! -e "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
        say "npm ci --prefix tests/k8s-models"
        npm ci --prefix tests/k8s-models --no-audit --no-fund --silent
    fi
fi

: "${HEADROOM_VLLM_VENV:=$HOME/.cache/headroom/venv-vllm}"
: "${HEADROOM_LITELLM_VENV:=$HOME/.cache/headroom/venv-litellm}"
export HEADROOM_VLLM_VENV HEADROOM_LITELLM_VENV
if [ -n "$want_engine" ]; then
    mkdir -p "$(dirname "$HEADROOM_VLLM_VENV")" "$(dirname "$HEADROOM_LITELLM_VENV")"
    say "vLLM CPU engine in $HEADROOM_VLLM_VENV"
    bash .ci/install-vllm.sh
    say "LiteLLM proxy in $HEADROOM_LITELLM_VENV"
    bash .ci/install-litellm.sh
fi
say "ready ($what)"
