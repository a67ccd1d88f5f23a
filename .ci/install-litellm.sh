#!/usr/bin/env bash
# Install the LiteLLM proxy (the real gateway used by the engine tests) into its own venv (idempotent).
#
#   HEADROOM_LITELLM_VENV   venv path (default: <repo>/.venv-litellm)
#   PYTHON                  interpreter used to create the venv (default: python3)
#
# Start it with `<venv>/bin/litellm --config CONFIG --host 127.0.0.1 --port PORT`; metrics at /metrics/.
set -euo pipefail

LITELLM_VERSION=1.108.7
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HEADROOM_LITELLM_VENV:-$repo/.venv-litellm}"
python="${PYTHON:-python3}"

ok() { [ -x "$venv/bin/litellm" ] && "$venv/bin/python" - <<PY 2>/dev/null
import importlib.metadata as md
assert md.version("litellm") == "$LITELLM_VERSION", md.version("litellm")
import prometheus_client  # noqa: F401
import litellm.proxy.proxy_server  # noqa: F401  (the proxy extras are present)
PY
}

if [ -x "$venv/bin/python" ] && ok; then
    echo "install-litellm: litellm $LITELLM_VERSION already usable in $venv"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
            rm -rf "$venv"
            "$python" -m venv "$venv"
        else
            echo "install-litellm: cannot create a venv with $python" >&2
            exit 1
        fi
    fi
fi

"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "litellm[proxy]==$LITELLM_VERSION" prometheus_client

if ! ok; then
    echo "install-litellm: litellm proxy does not import from $venv" >&2
    "$venv/bin/python" -c "import litellm.proxy.proxy_server" || true
    exit 1
fi
echo "install-litellm: litellm $LITELLM_VERSION ready in $venv"
