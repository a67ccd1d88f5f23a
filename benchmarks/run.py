"""`make bench`: run every benchmark and write benchmarks/results.json.

Each benchmark module exposes `main() -> dict`; its result is stored under the module's key, with
the machine it ran on, so figures are read as ratios against baselines measured in the same run.
`python benchmarks/run.py pipeline forecast` runs a subset.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: see monitor/commands/cli.py
os.environ.setdefault("OMP_NUM_THREADS", "1")

import importlib
import json
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

BENCHES = {
    "pipeline": "pipeline_bench",
    "forecast": "forecast_bench",
    "memory": "memory_bench",
    "load": "load_bench",
    "sim": "sim_bench",
    "endless": "endless_bench",
}


def main(argv: list[str]) -> int:
    wanted = argv or list(BENCHES)
    path = os.path.join(HERE, "results.json")
    results = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    for key in wanted:
        module_name = BENCHES.get(key)
        if module_name is None:
            print(f"unknown benchmark {key!r}; known: {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        if not os.path.exists(os.path.join(HERE, module_name + ".py")):
            print(f"[bench] {key}: not present, skipped", file=sys.stderr)
            continue
        print(f"[bench] {key} ...", file=sys.stderr, flush=True)
        t0 = time.time()
        module = importlib.import_module(module_name)
        results[key] = module.main()
        results[key]["_seconds"] = round(time.time() - t0, 1)
    results["_machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "platform": platform.platform(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps({k: v for k, v in results.items() if k in wanted}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
