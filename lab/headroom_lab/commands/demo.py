"""`headroom demo`: a simulated busy fleet watched by headroom, on this machine, in under two minutes.

Starts the simulated vLLM fleet (2 pools, 6 replicas, a gateway, application task metrics and DCGM
power), generates its past (headroom_lab/sim/history.py: the same fleet, workload and scenario clock, so
the history's peaks are the live fleet's), runs the headroom daemon on :9880 with that history in its
store and, when the `prometheus` binary is on the PATH, a real Prometheus with the bundled rules
scraping both (the same history backfilled with promtool first). The default scenario, `morning`,
starts on a Tuesday at 09:00 whatever the wall clock says: the morning burst takes the pools past their
knees and the alerts fire within two minutes, because the demo's copy of the rules shortens every
`for:` (DEMO_FOR_FACTOR; said when it starts). Ctrl-C stops every process it started.
"""
from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import yaml

from monitor.app import build
from monitor.commands.cli import listen_address, seconds
from monitor.config import from_dict
from monitor.kit.process import stop_process

log = logging.getLogger("headroom.demo")
# the checkout holding rules/ (lab/headroom_lab/commands/demo.py -> four levels up)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# what each scenario shows (`--help`); the knobs are in headroom_lab/sim/fleet.py SCENARIO_DEFAULTS
SCENARIOS = {
    "morning": "a Tuesday from 09:00 as the morning burst begins: a pool past its knee, queues, alerts "
               "within two minutes; the history is the same fleet's past",
    "diurnal": "the office-week profile on the wall clock (nights and weekends at least 40 % of the peak)",
    "steady": "flat load at the mix's rates",
    "burst": "70 % load, then 3x for 40 s from 10 s after start: a queue forms and drains",
    "replica-loss": "80 % load, then a chat-8b replica stops 30 s after start: N-1 becomes now",
}
DEMO_FOR_FACTOR = 30  # the demo's rules wait 1/30 of each `for:` (15m -> 30s) so alerts fire in minutes
LEAD_TIMES = {"meta-llama/Llama-3.1-8B-Instruct": "5m", "meta-llama/Llama-3.3-70B-Instruct": "15m"}


def add_arguments(p) -> None:
    p.add_argument("--scenario", default="morning", choices=list(SCENARIOS),
                   help="what the simulated fleet does (default: morning): "
                        + "; ".join(f"{k}: {v}" for k, v in SCENARIOS.items()).replace("%", "%%"))
    p.add_argument("--duration", type=seconds, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--web.listen-address", dest="listen_address", type=listen_address, default="127.0.0.1:9880",
                   help="where headroom serves /metrics and the landing page")
    p.add_argument("--prometheus.listen-address", dest="prom_address", default="127.0.0.1:9090",
                   help="where the demo's Prometheus listens (when installed)")
    p.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus even when installed")
    p.add_argument("--history-days", type=float, default=15.0, help="days of simulated history to generate")
    p.add_argument("--workdir", default=None, help="keep the demo's files here (default: a temp dir, removed)")
    p.add_argument("--seed", type=int, default=1)


def headroom_config(handle, fleet_cfg, store_path: Optional[str], prom_url: Optional[str] = None) -> dict:
    from ..sim.fleet import theoretical_knee
    # each replica carries its pod name, as Kubernetes service discovery would give it, so DCGM power
    # (labelled by Hostname/pod) joins the right replica
    targets = [{"url": u, "labels": {"pod": handle.replica_by_url[u]}}
               for urls in handle.replica_urls.values() for u in urls]
    pools = {}  # headroom's pools: (the digest reads its pool facts from here too)
    for name in handle.replica_urls:
        pp = fleet_cfg.pool(name)
        pools[pp.model_name] = {"max_num_seqs": int(pp.max_num_seqs),
                                "watts_per_replica": float(pp.max_watts * pp.gpus_per_replica),
                                "replicas": int(pp.replicas), "gpus_per_replica": int(pp.gpus_per_replica),
                                "kv_capacity_tokens_per_replica": float(pp.kv_capacity_tokens),
                                "idle_watts_per_gpu": float(pp.idle_watts), "max_watts_per_gpu": float(pp.max_watts),
                                # the simulated pool's knee by construction (the daemon learns its own)
                                "knee_requests_per_replica": round(theoretical_knee(pp, fleet_cfg.mix)["per_replica"], 1)}
        if pp.model_name in LEAD_TIMES:  # H100 replicas: scheduling, image pull and weights load
            pools[pp.model_name]["replica_lead_time"] = LEAD_TIMES[pp.model_name]
    model_of = {p.name: p.model_name for p in fleet_cfg.pools}
    task_types = fleet_cfg.mix.task_types.values()
    cfg = {
        "global": {"interval": "5s", "latency_window": "2m"},
        # the application's agent_* metrics carry no model: say which pool serves each task type
        # the knee is fitted after 2 minutes of cycles (default 60 observations: 5 minutes at 5 s)
        "capacity": {"task_pools": {t.name: model_of[t.pool] for t in task_types if t.pool in model_of},
                     "task_classes": {t.name: t.klass for t in task_types}, "min_observations": 24},
        "sources": {
            "vllm": {"targets": targets},
            "gateways": [{"kind": "envoy", "url": handle.gateway_url}, {"kind": "app", "url": handle.app_url}],
            "dcgm": {"targets": [handle.dcgm_url], "replica_label": "Hostname"},
        },
        "pools": pools,
    }
    if store_path:
        cfg["store"] = {"path": store_path}
        # the weekly digest of this history, written where the landing page's /digest finds it
        workdir = os.path.dirname(store_path)
        cfg["digest"] = {"outbox": os.path.join(workdir, "digest-outbox.sqlite"),
                         "destinations": [{"type": "directory", "path": os.path.join(workdir, "digests")}]}
    if prom_url:
        cfg["sources"]["alerts"] = {"url": prom_url, "kind": "prometheus"}
        cfg["web"] = {"links": {"Prometheus alerts": prom_url + "/alerts", "Prometheus: the week": week_graph(prom_url)}}
    return cfg


def week_graph(prom_url: str) -> str:
    """The Prometheus graph of each pool's active + queued requests over the last week: the
    backfilled history running into the live fleet."""
    from urllib.parse import quote
    expr = ("sum by (model_name) (vllm:num_requests_running) + "
            "sum by (model_name) (vllm:num_requests_waiting)")
    return f"{prom_url}/graph?g0.expr={quote(expr)}&g0.tab=0&g0.range_input=1w"


def scale_windows(expr: str, factor: int = DEMO_FOR_FACTOR) -> str:
    """Every range window of `expr` divided by `factor`, at least 10 s: `[10m]` -> `[20s]` for 30."""
    import re
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return re.sub(r"\[(\d+)([smhd])\]", lambda m: f"[{max(10, int(m.group(1)) * units[m.group(2)] // factor)}s]", expr)


def demo_rules(paths: list[str], out_dir: str, factor: int = DEMO_FOR_FACTOR) -> list[str]:
    """Copies of the bundled rule files with every alert's `for:` divided by `factor` (at least 5 s,
    the demo Prometheus's evaluation interval) and the range windows of its expression too (the
    alerts judge the median of a window; `scale_windows`): the same expressions, on a demo's time
    scale. Recording rules are left as they are."""
    from monitor.config import parse_duration
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for group in doc.get("groups") or []:
            for rule in group.get("rules") or []:
                if "for" in rule:
                    rule["for"] = f"{max(5, int(parse_duration(str(rule['for'])) // factor))}s"
                if "alert" in rule:
                    rule["expr"] = scale_windows(rule["expr"], factor)
        target = os.path.join(out_dir, "demo-" + os.path.basename(path))
        with open(target, "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        out.append(target)
    return out


def prometheus_config(handle, headroom_addr: str, rule_files: list[str]) -> str:
    replicas = [u.split("//", 1)[1].split("/", 1)[0] for urls in handle.replica_urls.values() for u in urls]
    aux = {"gateway": handle.gateway_url, "app": handle.app_url, "dcgm": handle.dcgm_url}
    doc = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": rule_files,
        "scrape_configs": [
            {"job_name": "headroom", "static_configs": [{"targets": [headroom_addr]}]},
            {"job_name": "vllm", "static_configs": [{"targets": replicas}]},
        ] + [{"job_name": job, "static_configs": [{"targets": [url.split("//", 1)[1].split("/", 1)[0]]}]}
             for job, url in aux.items()],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _wait_ready(url: str, timeout: float) -> bool:
    import requests
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.1)
    return False


def demo_history(fleet_cfg, scenario: str, days: float, now: float, seed: int = 1):
    """The live fleet's past: one frame for both the store and Prometheus, ending where serving
    starts. A scenario with a daily profile lends it its clock, levels and client time-outs; the
    others get the office week on the wall clock."""
    from ..sim.history import generate_history
    profiled = bool(fleet_cfg.scenarios.get(scenario, {}).get("profile"))
    return generate_history(fleet_cfg, days=days, step_s=60, end=now // 60 * 60, seed=seed,
                            scenario=scenario if profiled else None, origin=now)


def backfill(df, fleet_cfg, data_dir: str, workdir: str) -> Optional[str]:
    """The history's vLLM replica series into a Prometheus data dir (promtool); None if impossible."""
    promtool = shutil.which("promtool")
    if not promtool:
        return None
    from ..sim.history import write_openmetrics
    om = os.path.join(workdir, "history.om")
    write_openmetrics(df, om, fleet_cfg)
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", "--max-block-duration=24h",
                        om, data_dir], capture_output=True, text=True)
    os.unlink(om)
    if r.returncode != 0:
        log.warning("promtool backfill failed: %s", r.stderr.strip()[:300])
        return None
    return data_dir


def run(args) -> int:
    from ..sim.fleet import load_config
    from ..sim.server import start_fleet

    started = time.monotonic()
    workdir = args.workdir or tempfile.mkdtemp(prefix="headroom-demo-")
    os.makedirs(workdir, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    procs: list[subprocess.Popen] = []
    handle = daemon = None
    try:
        fleet_cfg = load_config(None)
        print(f"headroom demo: starting a simulated fleet ({args.scenario}: {SCENARIOS[args.scenario]}) ...",
              flush=True)
        handle = start_fleet(fleet_cfg, scenario=args.scenario, seed=args.seed, warmup_s=120.0,
                             scenario_from_serving=True)
        history = demo_history(fleet_cfg, args.scenario, args.history_days, handle.fleet.origin, args.seed)
        store_path = os.path.join(workdir, "history.sqlite")
        seed_history(history, fleet_cfg, store_path)
        use_prometheus = not args.no_prometheus and shutil.which("prometheus") is not None
        prom_url = f"http://{args.prom_address}" if use_prometheus else None
        doc = headroom_config(handle, fleet_cfg, store_path, prom_url)
        with open(os.path.join(workdir, "headroom.yml"), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        cfg = from_dict(doc, os.path.join(workdir, "headroom.yml"))
        daemon = build(cfg, args.listen_address)
        daemon.start()
        host, port = daemon.web.server.server_address[:2]
        headroom_url = f"http://{host}:{port}"
        if use_prometheus:
            prom_url = start_prometheus(args, history, fleet_cfg, handle, f"{host}:{port}", workdir, procs)
        _wait_ready(headroom_url + "/-/ready", 60)
        procs.append(build_digest(os.path.join(workdir, "headroom.yml"), workdir))
        print()
        print(f"  headroom landing page  {headroom_url}/")
        if prom_url:
            print(f"  Prometheus alerts      {prom_url}/alerts   (rules with every for: shortened "
                  f"{DEMO_FOR_FACTOR}x for the demo)")
            print(f"  Prometheus: the week   {week_graph(prom_url)}")
        else:
            print("  (install the Debian package 'prometheus' to also get a real Prometheus with the bundled rules)")
        print(f"  headroom metrics       {headroom_url}/metrics")
        print(f"  weekly digest          {headroom_url}/digest   (this week's, being built in the background)")
        print(f"  simulated replicas     {', '.join(u for urls in handle.replica_urls.values() for u in urls)}")
        print(f"  gateway / app / DCGM   {handle.gateway_url}  {handle.app_url}  {handle.dcgm_url}")
        print(f"  ready in {time.monotonic() - started:.0f} s; Ctrl-C stops everything", flush=True)
        stop.wait(timeout=args.duration)
        return 0
    finally:
        if daemon is not None:
            daemon.stop()
        for p in procs:
            stop_process(p)
        if handle is not None:
            handle.stop()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        print("headroom demo: stopped", file=sys.stderr)


def build_digest(config_file: str, workdir: str) -> subprocess.Popen:
    """This week's digest of the demo's history, built by `headroom digest` at low priority (it
    fits forecasts for a week of every series) so the live story is not slowed."""
    log_file = open(os.path.join(workdir, "digest.log"), "w")
    return subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "monitor", "digest", "--config.file",
                             config_file], stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)


def start_prometheus(args, history, fleet_cfg, handle, headroom_addr: str, workdir: str,
                     procs: list) -> Optional[str]:
    """A real Prometheus with the history backfilled and the demo's copy of the rules; its URL, or
    None when it did not become ready."""
    data_dir = os.path.join(workdir, "prometheus")
    os.makedirs(data_dir, exist_ok=True)
    print(f"headroom demo: backfilling {args.history_days:g} days of history into Prometheus ...", flush=True)
    backfill(history, fleet_cfg, data_dir, workdir)
    bundled = sorted(glob.glob(os.path.join(REPO, "rules", "*.yml")) + glob.glob(os.path.join(REPO, "rules", "*.yaml")))
    rules = demo_rules(bundled, workdir)
    with open(os.path.join(workdir, "prometheus.yml"), "w") as f:
        f.write(prometheus_config(handle, headroom_addr, rules))
    log_file = open(os.path.join(workdir, "prometheus.log"), "w")
    procs.append(subprocess.Popen(
        ["prometheus", f"--config.file={os.path.join(workdir, 'prometheus.yml')}",
         f"--storage.tsdb.path={data_dir}", f"--web.listen-address={args.prom_address}",
         "--storage.tsdb.retention.time=30d", "--web.enable-lifecycle"],
        stdout=log_file, stderr=subprocess.STDOUT))
    if _wait_ready(f"http://{args.prom_address}/-/ready", 30):
        return f"http://{args.prom_address}"
    print("headroom demo: Prometheus did not become ready; see " + os.path.join(workdir, "prometheus.log"))
    return None


def seed_history(df, fleet_cfg, store_path: str, step_s: int = 300) -> int:
    """The history into headroom's own store, as headroom would have recorded it every `step_s`
    (headroom_lab/sim/history.py `schema_history`: the history schema's names, pools by model name):
    active and queued requests, load, arrival_rate, kv_tokens, sessions."""
    from monitor.history.store import HistoryStore

    from ..sim.history import schema_history
    rows = schema_history(df, fleet_cfg)
    rows = rows[rows["timestamp"] % step_s == 0]
    keep = {"active_requests", "queued_requests", "load", "arrival_rate", "kv_tokens", "sessions"}
    rows = rows[rows["series"].isin(keep)]
    points = [(str(r.pool), str(r.series), float(r.timestamp), float(r.value)) for r in rows.itertuples()]
    with HistoryStore(store_path) as store:
        store.append(points)
    return len(points)
