"""The same numbers before and after a refactoring: 60 cycles of the simulated fleet, built by the
application's own wiring (`monitor.app.build` without an address: `headroom once`'s components) and
fed the fleet's /metrics texts as `collect` parses them, give byte-identical snapshot JSON.

The golden hash below was taken on the tree before the typed inputs (issue 41). Regenerate it only for
a deliberate change of a number (`python tests/app/test_same_numbers.py` prints the new one) and say so in
the commit."""
from __future__ import annotations

import hashlib
import json

from simfleet import DCGM_URL, TASK_LABELS, cycle_inputs, one_pool, watched

from headroom_lab.sim.fleet import Fleet
from monitor.app import build
from monitor.capacity.slo_settings import read_slos
from monitor.config import Capacity
from monitor.export.samples import Renderer
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.model import SourceStatus

START = 1_790_000_000.0
CYCLES = 60
GOLDEN_JSON = "25e5946774bd21820fe91908c5345a999dfb4f1f857a207cee7b6d61357af173"
GOLDEN_METRICS = "e3683661d2b84f8b40ad29eee7ffad6fdfbadec41739de30121eaf5846312c1e"


def run_cycles(cycles: int = CYCLES) -> tuple[str, str]:
    """sha256 of the snapshots' JSON (one line per cycle) and of their /metrics samples."""
    fleet = Fleet(one_pool(3, {"ask": _task(1.5), "agent": _task(0.5, 2)}, gateway=TASK_LABELS), "steady", seed=3,
                  start_time=START)
    urls, cfg = watched(fleet, Capacity(task_window=30.0, task_classes={"agent": "deferrable"}),
                        read_slos({"task_types": {"ask": {"p95_seconds": 5}}, "windows": ["1m", "5m"],
                                   "pools": {"m": {"ttft_p95_seconds": 0.5}}}))
    app = build(cfg)
    try:
        pipeline = app.pipeline
        docs, samples = hashlib.sha256(), hashlib.sha256()
        for _ in range(cycles):
            fleet.advance(5.0)
            statuses = [SourceStatus("vllm", u, True) for u in urls.values()]
            statuses.append(SourceStatus("dcgm", DCGM_URL, True))
            inputs = cycle_inputs(fleet, urls, cfg, pipeline.state.capacity, statuses=statuses)
            snapshot = pipeline.advance(inputs, fleet.t)
            pipeline.publish(snapshot)
            docs.update(json.dumps(snapshot_to_dict(snapshot), sort_keys=True, allow_nan=False).encode() + b"\n")
            samples.update(repr(sorted(Renderer().render(snapshot).items())).encode() + b"\n")
        return docs.hexdigest(), samples.hexdigest()
    finally:
        app.stop()


def _task(rate: float, calls: int = 1) -> dict:
    from simfleet import calls as step
    from simfleet import task
    return task(rate, step(calls))


def test_sixty_cycles_of_the_simulated_fleet_give_the_same_snapshot_json():
    docs, samples = run_cycles()
    assert docs == GOLDEN_JSON
    assert samples == GOLDEN_METRICS


if __name__ == "__main__":
    import sys
    sys.path.insert(0, "tests")
    print(*run_cycles())
