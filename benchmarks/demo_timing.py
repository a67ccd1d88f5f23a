"""How long `headroom demo` takes to tell its story, over repeated runs (issue: the demo in two minutes).

Each trial starts `headroom demo` (default scenario `morning`, a real Prometheus when installed) and
polls /api/v1/snapshot every second, noting the seconds from the start of the process to: the landing
page answering, a queue in a pool, a pool past its knee (utilisation > 1), the first Headroom* alert
firing in the demo's Prometheus (read back through sources.alerts), each alert's first firing, a
forecast on the page, and a knee learned (source "learned", with its confidence). Writes
benchmarks/demo_timing.json (every trial, the median and worst of each mark, the machine).

    .venv/bin/python benchmarks/demo_timing.py [--trials 3] [--duration 330]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from servers import free_port  # noqa: E402  (tests/servers.py: the one port helper)


def trial(duration: float) -> dict:
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "demo", "--duration", str(duration),
                             "--web.listen-address", f"127.0.0.1:{port}",
                             "--prometheus.listen-address", f"127.0.0.1:{free_port()}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=os.path.dirname(HERE))
    marks: dict = {}
    knees: dict = {}
    while proc.poll() is None:
        try:
            doc = requests.get(f"http://127.0.0.1:{port}/api/v1/snapshot", timeout=2).json()
        except (requests.RequestException, ValueError):
            time.sleep(0.5)
            continue
        t = round(time.monotonic() - t0, 1)
        marks.setdefault("page", t)
        for p in doc.get("pools") or []:
            cap = p.get("capacity") or {}
            if (p.get("queued_requests") or 0) > 0:
                marks.setdefault("queue", t)
            if (cap.get("utilisation_ratio") or 0) > 1:
                marks.setdefault("past_knee", t)
            if (p.get("forecast") or {}).get("horizons", {}).get("1d"):
                marks.setdefault("forecast", t)
            if (cap.get("knee_info") or {}).get("source") == "learned":
                marks.setdefault("knee_learned", t)
                knees.setdefault(p["pool"], {"at": t, "knee_requests": cap.get("knee_requests"),
                                             "confidence": cap.get("knee_confidence_ratio")})
        for a in doc.get("alerts") or []:
            if a["state"] == "firing":
                marks.setdefault("first_alert", t)
                marks.setdefault("alert:" + a["alertname"], t)
        time.sleep(1.0)
    out = proc.communicate()[0]
    ready = next((line for line in out.splitlines() if "ready in" in line), "")
    return {"marks": marks, "knees": knees, "ready_line": ready.strip(), "returncode": proc.returncode}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--duration", type=float, default=330.0)
    args = ap.parse_args()
    trials = []
    for i in range(args.trials):
        r = trial(args.duration)
        print(f"trial {i + 1}: {json.dumps(r['marks'])}", flush=True)
        trials.append(r)
    keys = sorted({k for r in trials for k in r["marks"]})
    summary = {}
    for k in keys:
        got = [r["marks"][k] for r in trials if k in r["marks"]]
        summary[k] = {"trials_with_it": len(got), "median_s": statistics.median(got), "worst_s": max(got)}
    doc = {"what": "seconds from starting `headroom demo` to each mark (benchmarks/demo_timing.py)",
           "duration_s": args.duration, "trials": trials, "summary": summary,
           "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}}
    with open(os.path.join(HERE, "demo_timing.json"), "w") as f:
        json.dump(doc, f, indent=1)
    for k, v in summary.items():
        print(f"{k:40s} {v['trials_with_it']}/{len(trials)} trials  median {v['median_s']:6.1f} s  worst {v['worst_s']:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
