"""The machine's own Python speed, printed beside every CPU ratio (issue 42).

Python's cost moves more between machines than Prometheus' (Go) does, so a ratio measured on one
machine says little on another unless the machine's speed is quoted with it. `python_speed()` times a
fixed pure-Python workload (dict and string work of the kind a text parser does: split, lookups,
float parsing) and returns the median of `trials` runs in seconds; lower is faster. Reference: 0.023 s on
the project's 2-core machine class when quiet (2026-12-06).

    python benchmarks/machine_speed.py
"""
from __future__ import annotations

import json
import os
import statistics
import time

_LINES = [f'vllm:metric_{i % 37}{{model_name="m{i % 5}",le="{i % 11}.5"}} {i * 1.25}' for i in range(2000)]


def _workload() -> float:
    total, seen = 0.0, {}
    for _ in range(10):
        for line in _LINES:
            name, _, rest = line.partition("{")
            labels, _, value = rest.rpartition("} ")
            seen[name] = seen.get(name, 0) + 1
            for pair in labels.split(","):
                key, _, _val = pair.partition("=")
                seen[key] = seen.get(key, 0) + 1
            total += float(value)
    return total


def python_speed(trials: int = 5) -> float:
    """Median seconds of the fixed workload (CPU time of this process, so waiting is not counted)."""
    times = []
    for _ in range(trials):
        start = time.process_time()
        _workload()
        times.append(time.process_time() - start)
    return round(statistics.median(times), 4)


def describe() -> dict:
    """What a results file records beside a ratio: the speed and the load it was measured at."""
    return {"python_speed_s": python_speed(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count()}


if __name__ == "__main__":
    print(json.dumps(describe()))
