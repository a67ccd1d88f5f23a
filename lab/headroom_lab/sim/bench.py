"""Speed of the simulator (for benchmarks/, not for tests).

``main()`` (the benchmarks/run.py interface) fast-forwards the default fleet (steady scenario at
the demo load: both pools busy, queues forming now and then) for one simulated hour, and the same
fleet step by step (``Replica.max_jump = 1``, one event per decode step: the baseline the jump
logic is measured against) for a shorter stretch; it reports CPU seconds per simulated hour for
both, their ratio, and the history generator's time for 14 days at 60 s.
``python -m headroom_lab.sim.bench [hours]`` prints the same.
"""
from __future__ import annotations

import json
import sys
import time

from .engine import Replica
from .fleet import Fleet, load_config
from .history import generate_history

T0 = 1_790_000_000.0


def fast_forward(hours: float = 1.0, seed: int = 1, max_jump: int = 1 << 30) -> dict:
    cfg = load_config()
    old = Replica.max_jump
    Replica.max_jump = max_jump
    try:
        f = Fleet(cfg, "steady", seed=seed, start_time=T0, record_truth=False)
        f.advance(120.0)  # past the ramp-up from an empty fleet
        w0, c0 = time.perf_counter(), time.process_time()
        f.advance(hours * 3600.0)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        Replica.max_jump = old
    finished = sum(sum(r.stats.success.values()) for r in f.replicas)
    return {"simulated_hours": hours, "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "cpu_seconds_per_sim_hour": round(cpu / hours, 2), "events": f.events_processed,
            "requests_finished": finished, "replicas": len(f.replicas)}


def history_seconds(days: float = 14.0) -> dict:
    w0, c0 = time.perf_counter(), time.process_time()
    df = generate_history(None, days=days, step_s=60, end=1_790_000_000)
    return {"days": days, "rows": len(df), "wall_seconds": round(time.perf_counter() - w0, 2),
            "cpu_seconds": round(time.process_time() - c0, 2)}


def main(hours: float = 1.0) -> dict:
    jumps = fast_forward(hours)
    baseline = fast_forward(min(hours, 0.1), max_jump=1)
    return {
        "fast_forward": jumps,
        "baseline_step_by_step": baseline,
        "speedup_vs_step_by_step": round(baseline["cpu_seconds_per_sim_hour"]
                                         / max(1e-9, jumps["cpu_seconds_per_sim_hour"]), 2),
        "speedup_vs_real_time": round(3600.0 / max(1e-9, jumps["cpu_seconds_per_sim_hour"]), 1),
        "history_14d_60s": history_seconds(),
    }


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0), indent=2))
