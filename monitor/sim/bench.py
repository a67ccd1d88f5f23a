"""Speed of the simulator (for benchmarks/, not for tests).

``python -m monitor.sim.bench [hours]`` fast-forwards the default fleet (steady scenario, the
demo load: both pools busy, queues forming now and then) and prints wall and CPU seconds per
simulated hour, events and finished requests. ``history_seconds(days)`` times the history
generator."""
from __future__ import annotations

import json
import sys
import time

from .fleet import Fleet, load_config
from .history import generate_history


def fast_forward(hours: float = 1.0, seed: int = 1) -> dict:
    cfg = load_config()
    f = Fleet(cfg, "steady", seed=seed, start_time=1_790_000_000.0, record_truth=False)
    w0, c0 = time.perf_counter(), time.process_time()
    f.advance(hours * 3600.0)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finished = sum(sum(r.stats.success.values()) for r in f.replicas)
    return {"simulated_hours": hours, "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "events": f.events_processed, "requests_finished": finished,
            "replicas": len(f.replicas)}


def history_seconds(days: float = 14.0) -> dict:
    w0, c0 = time.perf_counter(), time.process_time()
    df = generate_history(None, days=days, step_s=60, end=1_790_000_000)
    return {"days": days, "rows": len(df), "wall_seconds": round(time.perf_counter() - w0, 2),
            "cpu_seconds": round(time.process_time() - c0, 2)}


if __name__ == "__main__":  # pragma: no cover
    hours = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(json.dumps({"fast_forward": fast_forward(hours), "history": history_seconds()}))
