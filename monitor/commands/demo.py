"""`headroom demo`: a simulated busy fleet watched by headroom, on this machine, in under two minutes.

Starts the simulated vLLM fleet (2 pools, 6 replicas, a gateway, application task metrics and DCGM
power), generates two weeks of history for the forecasts, runs the headroom daemon on :9880 and,
when the `prometheus` binary is on the PATH, a real Prometheus with the bundled rules scraping both
(the history backfilled with promtool first). Ctrl-C stops every process it started.
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

from ..cli import seconds
from ..config import from_dict
from ..process import stop_process
from ..app import build

log = logging.getLogger("headroom.demo")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_arguments(p) -> None:
    p.add_argument("--scenario", default="diurnal", choices=["steady", "burst", "diurnal", "replica-loss"],
                   help="what the simulated fleet does (default: diurnal)")
    p.add_argument("--duration", type=seconds, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:9880",
                   help="where headroom serves /metrics and the landing page")
    p.add_argument("--prometheus.listen-address", dest="prom_address", default="127.0.0.1:9090",
                   help="where the demo's Prometheus listens (when installed)")
    p.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus even when installed")
    p.add_argument("--history-days", type=float, default=15.0, help="days of simulated history to generate")
    p.add_argument("--workdir", default=None, help="keep the demo's files here (default: a temp dir, removed)")
    p.add_argument("--seed", type=int, default=1)


def headroom_config(handle, fleet_cfg, store_path: Optional[str]) -> dict:
    # each replica carries its pod name, as Kubernetes service discovery would give it, so DCGM power
    # (labelled by Hostname/pod) joins the right replica
    targets = [{"url": u, "labels": {"pod": handle.replica_by_url[u]}}
               for urls in handle.replica_urls.values() for u in urls]
    pools = {}
    for name in handle.replica_urls:
        pp = fleet_cfg.pool(name)
        pools[pp.model_name] = {"max_num_seqs": int(pp.max_num_seqs),
                                "watts_per_replica": float(pp.max_watts * pp.gpus_per_replica)}
    model_of = {p.name: p.model_name for p in fleet_cfg.pools}
    task_types = fleet_cfg.mix.task_types.values()
    cfg = {
        "global": {"interval": "5s", "latency_window": "2m"},
        # the application's agent_* metrics carry no model: say which pool serves each task type
        "capacity": {"task_pools": {t.name: model_of[t.pool] for t in task_types if t.pool in model_of},
                     "task_classes": {t.name: t.klass for t in task_types}},
        "sources": {
            "vllm": {"targets": targets},
            "gateways": [{"kind": "envoy", "url": handle.gateway_url}, {"kind": "app", "url": handle.app_url}],
            "dcgm": {"targets": [handle.dcgm_url], "replica_label": "Hostname"},
        },
        "pools": pools,
    }
    if store_path:
        cfg["store"] = {"path": store_path}
    return cfg


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


def backfill(fleet_cfg, days: float, data_dir: str, workdir: str) -> Optional[str]:
    """Two weeks of simulated vLLM series into a Prometheus data dir (promtool); None if impossible."""
    promtool = shutil.which("promtool")
    if not promtool:
        return None
    from ..sim.history import generate_history, write_openmetrics
    df = generate_history(fleet_cfg, days=days, step_s=60)
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
        print(f"headroom demo: starting a simulated fleet ({args.scenario}) ...", flush=True)
        handle = start_fleet(fleet_cfg, scenario=args.scenario, seed=args.seed, warmup_s=120.0,
                             scenario_from_serving=True)
        store_path = os.path.join(workdir, "history.sqlite")
        seed_history(fleet_cfg, args.history_days, store_path)
        cfg = from_dict(headroom_config(handle, fleet_cfg, store_path), os.path.join(workdir, "headroom.yml"))
        with open(os.path.join(workdir, "headroom.yml"), "w") as f:
            yaml.safe_dump(headroom_config(handle, fleet_cfg, store_path), f, sort_keys=False)
        daemon = build(cfg, args.listen_address)
        daemon.start()
        host, port = daemon.web.server.server_address[:2]
        headroom_url = f"http://{host}:{port}"
        prom_url = None
        if not args.no_prometheus and shutil.which("prometheus"):
            data_dir = os.path.join(workdir, "prometheus")
            os.makedirs(data_dir, exist_ok=True)
            print(f"headroom demo: backfilling {args.history_days:g} days of history into Prometheus ...", flush=True)
            backfill(fleet_cfg, args.history_days, data_dir, workdir)
            rules = sorted(glob.glob(os.path.join(REPO, "rules", "*.yml")) + glob.glob(os.path.join(REPO, "rules", "*.yaml")))
            with open(os.path.join(workdir, "prometheus.yml"), "w") as f:
                f.write(prometheus_config(handle, f"{host}:{port}", rules))
            log_file = open(os.path.join(workdir, "prometheus.log"), "w")
            procs.append(subprocess.Popen(
                ["prometheus", f"--config.file={os.path.join(workdir, 'prometheus.yml')}",
                 f"--storage.tsdb.path={data_dir}", f"--web.listen-address={args.prom_address}",
                 "--storage.tsdb.retention.time=30d", "--web.enable-lifecycle"],
                stdout=log_file, stderr=subprocess.STDOUT))
            if _wait_ready(f"http://{args.prom_address}/-/ready", 30):
                prom_url = f"http://{args.prom_address}"
            else:
                print("headroom demo: Prometheus did not become ready; see " + os.path.join(workdir, "prometheus.log"))
        _wait_ready(headroom_url + "/-/ready", 60)
        print()
        print(f"  headroom landing page  {headroom_url}/")
        print(f"  headroom metrics       {headroom_url}/metrics")
        if prom_url:
            print(f"  Prometheus (rules, history)  {prom_url}/graph?g0.expr=headroom_active_requests&g0.tab=0")
            print(f"  alerts                 {prom_url}/alerts")
        else:
            print("  (install the Debian package 'prometheus' to also get a real Prometheus with the bundled rules)")
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


def seed_history(fleet_cfg, days: float, store_path: str) -> int:
    """Load simulated history into headroom's own store, as headroom would have recorded it
    (monitor/sim/history.py `schema_history`: the history schema's names, pools by model name):
    active and queued requests, load, arrival_rate, kv_tokens, sessions."""
    from ..forecast.store import HistoryStore
    from ..sim.history import generate_history, schema_history
    df = generate_history(fleet_cfg, days=days, step_s=300, replica_series=False, end=time.time() // 300 * 300)
    rows = schema_history(df, fleet_cfg)
    keep = {"active_requests", "queued_requests", "load", "arrival_rate", "kv_tokens", "sessions"}
    rows = rows[rows["series"].isin(keep)]
    points = [(str(r.pool), str(r.series), float(r.timestamp), float(r.value)) for r in rows.itertuples()]
    with HistoryStore(store_path) as store:
        store.append(points)
    return len(points)
