"""The overload users feel, end to end, with the alert rules as shipped (issue 37's proof).

Per trial: the real vLLM CPU engine (the engine tier's reference: `small`, 8 slots, 24 x 128 KV
tokens, engine at nice 10), the real LiteLLM proxy in front of it (task-type label), an agent
application (tests/engine/agent_app.py: closed-loop 3-call chat tasks with tool waits, a 10 s task
target, some sessions giving up after 4 s without a reply), headroom `run` in direct mode at its
default 15 s interval reading the engine, LiteLLM and the application, and a real Prometheus scraping
all four every 15 s and evaluating `rules/` **unchanged** (no shortened window or `for:`).

Phases: light (3 sessions), overload (20 sessions, 5 giving up), idle. Variants:
- `engine`: the engine is the bottleneck (20 sessions on 8 slots);
- `frontend`: a slow gateway in front of LiteLLM holds requests (4 at a time, +0.3 s each), so the
  engine's gauges and LiteLLM's in-flight gauge see little of the wait: only the callers' task
  latency shows it.
What a trial must show (the issue's bar): a page (a `severity="critical"` Headroom alert firing)
within 10 minutes of the overload's start; no capacity or latency alert firing in the light phase;
every page cleared within 15 minutes of the idle phase's start. Beside the alert timeline it records
the client's truth per phase (calls in flight, call TTFT quantiles, share of tasks over target,
give-ups) and headroom's figures (median headroom ratio, queued by where, the limiting factor).

    python benchmarks/overload_journey.py --variant engine --trials 3   # ~25-35 min a trial
    python benchmarks/overload_journey.py --light 60 --overload 240 --idle 120 --trials 1  # smoke

Results: benchmarks/overload_journey_results.json (one entry per trial, appended per variant).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, HERE)

import requests  # noqa: E402
import yaml  # noqa: E402
from engine import servers  # noqa: E402  (tests/engine: the real engine and proxy)
from engine.agent_app import AgentApp, SlowGateway  # noqa: E402
from servers import Prometheus, free_port, scrape_config, wait_http  # noqa: E402

RESULTS = os.path.join(HERE, "overload_journey_results.json")
TARGET_SECONDS = 10.0
# alerts about the pool's capacity or its users' latency (what must stay quiet when load is light)
CAPACITY_ALERTS = ("HeadroomLow", "HeadroomCriticallyLow", "HeadroomAboveKnee", "HeadroomQueueBuilding",
                   "HeadroomLoadShed", "HeadroomTaskLatencyBudgetBurn", "HeadroomLatencyOverTarget",
                   "HeadroomKVCachePressure", "HeadroomNMinus1Lost")


def headroom_config(workdir: str, engine, gateway, app_port: int) -> str:
    cfg = {
        "global": {"interval": "15s"},
        "sources": {"vllm": {"targets": [engine.url + "/metrics"]},
                    "gateways": [{"kind": "litellm", "url": gateway.info["metrics_url"]},
                                 {"kind": "app", "url": f"http://127.0.0.1:{app_port}/metrics",
                                  "pool": servers.SERVED_MODEL}]},
        "pools": {servers.SERVED_MODEL: {"max_num_seqs": engine.info["max_num_seqs"]}},
        "slos": {"task_types": {"chat": {"p95_seconds": TARGET_SECONDS}}},
        "store": {"path": os.path.join(workdir, "history.sqlite")},
        "web": {"listen_address": f"127.0.0.1:{free_port()}"},
    }
    path = os.path.join(workdir, "headroom.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def start_prometheus(workdir: str, targets: dict) -> Prometheus:
    """Prometheus 2.42 scraping every 15 s, evaluating the shipped rules unchanged every 15 s."""
    text = yaml.safe_load(scrape_config({job: [(t, None)] for job, t in targets.items()}, interval="15s"))
    text["global"]["evaluation_interval"] = "15s"
    text["rule_files"] = [os.path.join(REPO, "rules", "headroom.rules.yaml"),
                          os.path.join(REPO, "rules", "headroom.alerts.yaml")]
    for job in text["scrape_configs"]:
        if job["job_name"] == "litellm":
            job["metrics_path"] = "/metrics/"
    return Prometheus(workdir, yaml.safe_dump(text, sort_keys=False))


class AlertLog:
    """Polls Prometheus' /api/v1/alerts every 5 s: (time, alertname, severity, state, labels)."""

    def __init__(self, prom: Prometheus) -> None:
        self.prom, self.rows, self.stop = prom, [], threading.Event()
        self.thread = threading.Thread(target=self._run, name="alert-log", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(5.0):
            try:
                alerts = requests.get(self.prom.url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
            except (requests.RequestException, ValueError, KeyError):
                continue
            now = time.time()
            for a in alerts:
                lab = a.get("labels", {})
                self.rows.append((now, lab.get("alertname"), lab.get("severity"), a.get("state"),
                                  {k: lab[k] for k in ("pool", "task_type") if k in lab}))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def quiet_for(alerts: "AlertLog", seconds: float, deadline: float) -> None:
    """The idle phase: until no Headroom page has been pending or firing for `seconds` (the pages
    cleared and stayed clear), or `deadline` seconds at most. A condition with a deadline: the
    clearing time is what the trial measures."""
    start = time.time()
    while time.time() - start < deadline:
        paging = [t for t, name, sev, state, lab in alerts.rows
                  if t >= start and sev == "critical" and (name or "").startswith("Headroom")]
        last = max(paging, default=start)
        if time.time() - last >= seconds and time.time() - start >= seconds:
            return
        time.sleep(5.0)


def first(rows, start: float, end: float, pred) -> float | None:
    times = [t - start for t, *rest in rows if start <= t < end and pred(*rest)]
    return round(min(times), 1) if times else None


def judge(alerts: AlertLog, phases: dict) -> dict:
    """The issue's bar, read off the alert timeline."""
    ls, os_, is_, end = phases["light"], phases["overload"], phases["idle"], phases["end"]
    page = lambda name, sev, state, lab: sev == "critical" and state == "firing" and name.startswith("Headroom")  # noqa: E731
    cap_firing = lambda name, sev, state, lab: state == "firing" and name in CAPACITY_ALERTS  # noqa: E731
    light_firing = sorted({r[1] for r in alerts.rows if ls <= r[0] < os_ and cap_firing(*r[1:])})
    first_page = first(alerts.rows, os_, is_, page)
    pages_late = [r[0] - is_ for r in alerts.rows if r[0] >= is_ and page(*r[1:])]
    last_page_after_idle = round(max(pages_late), 1) if pages_late else 0.0
    fired = {}
    for t, name, _sev, state, _lab in alerts.rows:
        if state == "firing" and os_ <= t < end:
            fired.setdefault(name, round(t - os_, 1))
    return {"first_page_s": first_page, "page_within_10_min": first_page is not None and first_page <= 600,
            "light_phase_firing": light_firing, "quiet_in_light_phase": not light_firing,
            "pages_cleared_after_idle_s": last_page_after_idle,
            # None: no page to clear (a trial that never paged fails the first check instead)
            # decidable once the idle phase ran 15 min, or ended early with the pages clear for --quiet s
            "cleared_within_15_min": (last_page_after_idle <= 900) if first_page is not None else None,
            "first_firing_s_since_overload": fired}


def client_truth(app: AgentApp, start: float, end: float) -> dict:
    tasks = [t for t in app.tasks if start <= t.start < end and t.end is not None]
    calls = [c for c in app.calls_log if start <= c.start < end and c.end is not None]
    ttft = sorted(c.first_byte - c.start for c in calls if c.first_byte and not c.abandoned and not c.error)
    over = [t for t in tasks if not t.completed or (t.end - t.start) > TARGET_SECONDS]
    flight = [n for t, n in app.in_flight_samples if start <= t < end]
    q = lambda xs, p: round(xs[min(len(xs) - 1, int(p * len(xs)))], 2) if xs else None  # noqa: E731
    return {"tasks": len(tasks), "tasks_over_target_share": round(len(over) / len(tasks), 3) if tasks else None,
            "calls": len(calls), "given_up": sum(c.abandoned for c in calls),
            "errors": sum(bool(c.error) for c in calls),
            "ttft_p50_s": q(ttft, 0.5), "ttft_p95_s": q(ttft, 0.95),
            "calls_in_flight_mean": round(statistics.fmean(flight), 2) if flight else None}


def headroom_figures(prom: Prometheus, start: float, end: float) -> dict:
    """Medians over the phase of what headroom exported, read back from Prometheus."""
    def median_of(q: str):
        try:
            r = requests.get(prom.url + "/api/v1/query_range", timeout=20,
                             params={"query": q, "start": start, "end": end, "step": 15}).json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            return None
        out = {}
        for series in r:
            vals = [float(v) for _, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
            key = ",".join(f"{k}={v}" for k, v in sorted(series["metric"].items()) if k not in ("instance", "job"))
            out[key or "value"] = round(statistics.median(vals), 3) if vals else None
        return out
    return {"headroom_ratio": median_of('headroom_ratio{scenario="current"}'),
            "queued_requests": median_of("headroom_queued_requests"),
            "active_requests": median_of("headroom_active_requests"),
            "capacity_requests": median_of("headroom_capacity_requests"),
            "knee_requests": median_of("headroom_knee_requests"),
            "shed_requests_rate": median_of("headroom_shed_requests_rate"),
            "litellm_in_flight": median_of("sum(litellm_in_flight_requests)"),
            "engine_running_waiting": median_of("sum(vllm:num_requests_running) + sum(vllm:num_requests_waiting)")}


def run_trial(args, seed: int, workdir: str) -> dict:
    model = servers.build_tiny_model(os.path.join(workdir, "model"), python=servers.vllm_python(), size="small")
    engine = servers.start_vllm(model, max_num_seqs=8, num_gpu_blocks=24, log_dir=workdir)
    gateway = servers.start_litellm(engine.url, log_dir=workdir)
    slow = SlowGateway(gateway.url, concurrency=4, delay=0.3) if args.variant == "frontend" else None
    app = AgentApp((slow or gateway).url, servers.SERVED_MODEL, gateway.info["master_key"],
                   give_up_seconds=args.give_up_seconds, stream=not args.no_stream, seed=seed)
    app_port = app.serve()
    cfg = headroom_config(workdir, engine, gateway, app_port)
    listen = yaml.safe_load(open(cfg))["web"]["listen_address"]
    log = open(os.path.join(workdir, "headroom.log"), "w")
    daemon = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", cfg],
                              stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    prom = alerts = None
    try:
        wait_http(f"http://{listen}/-/ready", timeout=120)
        prom = start_prometheus(workdir, {"headroom": listen, "vllm": engine.url.split("//")[1],
                                          "litellm": gateway.url.split("//")[1], "app": f"127.0.0.1:{app_port}"})
        alerts = AlertLog(prom)
        phases = {"light": time.time()}
        app.set_sessions(args.light_sessions)
        time.sleep(args.light)  # the phase's length is the experiment, not a wait for a condition
        phases["overload"] = time.time()
        app.set_sessions(args.sessions, give_up=args.give_up)
        time.sleep(args.overload)
        phases["idle"] = time.time()
        app.set_sessions(0)
        quiet_for(alerts, args.quiet, args.idle)
        phases["end"] = time.time()
        result = {"variant": args.variant, "seed": seed, "judged": judge(alerts, phases),
                  "phases_s": {k: round(v - phases["light"], 1) for k, v in phases.items()}}
        for name, (a, b) in {"light": (phases["light"], phases["overload"]),
                             "overload": (phases["overload"], phases["idle"]),
                             "idle": (phases["idle"], phases["end"])}.items():
            result[name] = {"client": client_truth(app, a, b), "headroom": headroom_figures(prom, a, b)}
        result["alert_timeline"] = _transitions(alerts.rows, phases["light"])
        return result
    finally:
        if alerts:
            alerts.close()
        app.stop()
        daemon.terminate()
        daemon.wait(30)
        for s in (prom, slow, gateway, engine):
            if s is not None:
                s.stop()


def _transitions(rows, t0: float) -> list:
    """Each alert's state changes (not every poll): [seconds since the light phase, name, state]."""
    last, out = {}, []
    for t, name, sev, state, lab in rows:
        key = (name, tuple(sorted(lab.items())))
        if last.get(key) != state:
            last[key] = state
            out.append([round(t - t0, 1), name, sev, state, lab])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=("engine", "frontend"), default="engine")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1, help="seed of the first trial (the next ones count up)")
    ap.add_argument("--light", type=float, default=300.0, help="seconds of light load (3 sessions)")
    ap.add_argument("--overload", type=float, default=720.0, help="seconds of overload (12 min: a page is due in 10)")
    ap.add_argument("--idle", type=float, default=1080.0,
                    help="seconds of idle at most after the overload (over 15 min, so clearing within 15 min is decidable)")
    ap.add_argument("--quiet", type=float, default=180.0,
                    help="the idle phase ends early once no page has been pending or firing for this long")
    ap.add_argument("--light-sessions", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--give-up", type=int, default=5, help="sessions that give up on a slow call")
    ap.add_argument("--give-up-seconds", type=float, default=4.0)
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    for seed in range(args.first_seed, args.first_seed + args.trials):
        with tempfile.TemporaryDirectory(prefix="headroom-journey-") as workdir:
            trial = run_trial(args, seed, workdir)
        trial.update(load_average=os.getloadavg(), date=time.strftime("%Y-%m-%d %H:%M"), args=vars(args))
        record(args.out, args.variant, trial)  # each trial kept as it ends
        print(json.dumps(trial["judged"]), flush=True)
    return 0


def record(path: str, variant: str, trial: dict) -> None:
    """Append a trial to the variant's list (trials of earlier runs are kept) and recount."""
    results = json.load(open(path)) if os.path.exists(path) else {}
    entry = results.setdefault(variant, {})
    entry.pop("args", None)  # older files kept one run's arguments per variant; now each trial has its own
    entry.update(machine=platform.machine(), cpus=os.cpu_count())
    trials = entry.setdefault("trials", [])
    trials.append(trial)
    judged = [t["judged"] for t in trials]
    entry.update(pages_within_10_min=f"{sum(j['page_within_10_min'] for j in judged)} of {len(judged)}",
                 quiet_light_phases=f"{sum(j['quiet_in_light_phase'] for j in judged)} of {len(judged)}",
                 cleared_within_15_min=f"{sum(bool(j['cleared_within_15_min']) for j in judged)} of {len(judged)}")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
