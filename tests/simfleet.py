"""The simulated fleet as the tests drive it in this process (no socket, a clock they advance).

One pool `p` serving model `m` on two replicas (16 slots, 4,096 KV blocks of 16 tokens each, no prefix
caching), calls of about 600 prompt and 120 output tokens. `one_pool` is its headroom-lab FleetConfig,
`watched` the headroom Config that scrapes it (each replica by URL, an Envoy-style gateway, the
application's task metrics), `cycle_inputs` one cycle's inputs parsed as `collect` parses the pages.
The fleets served on loopback are `headroom_lab.sim.server.start_fleet`'s.
"""
from __future__ import annotations

from typing import Optional

from headroom_lab.sim.exposition import render_app, render_dcgm, render_gateway, render_vllm
from headroom_lab.sim.fleet import Fleet, FleetConfig, config_from_dict
from monitor.capacity.slo import SloSettings
from monitor.config import Capacity, Config, GatewaySource, PoolSettings, Target
from monitor.sources.dcgm import read_dcgm
from monitor.sources.gateway import read_gateway_scrape
from monitor.sources.vllm import readings_from_text
from monitor.step.cycle_state import CycleInputs

DCGM_URL = "http://dcgm:9400/metrics"
GATEWAYS = (GatewaySource(kind="envoy", url="http://gateway:1064/metrics"), GatewaySource(kind="app", url="http://app/metrics"))
TASK_LABELS = {"session_label": False, "task_type_label": True}  # the gateway labels calls by task type


def calls(n: int = 1, tool_wait_s: Optional[float] = None) -> dict:
    """One step of a task: `n` model calls of the usual size, then a tool wait."""
    step = {"calls": n, "prompt": {"mean": 600, "cv": 0.3, "max": 2000}, "output": {"mean": 120, "cv": 0.5, "max": 1000}}
    return {**step, "tool_wait_s": tool_wait_s} if tool_wait_s is not None else step


def task(rate_per_s: float, *steps: dict) -> dict:
    return {"pool": "p", "rate_per_s": rate_per_s, "steps": list(steps) or [calls()]}


def one_pool(seed: int, task_types: Optional[dict] = None, *, replicas: int = 2, max_num_seqs: int = 16,
             num_gpu_blocks: int = 4096, gateway: Optional[dict] = None) -> FleetConfig:
    """The one-pool fleet; by default one task type `ask` of one call at one task a second."""
    doc = {"seed": seed,
           "pools": {"p": {"model_name": "m", "replicas": replicas, "max_num_seqs": max_num_seqs,
                           "num_gpu_blocks": num_gpu_blocks, "block_size": 16, "enable_prefix_caching": False,
                           "max_model_len": 4096}},
           "mix": {"task_types": task_types or {"ask": task(1.0)}}}
    if gateway is not None:
        doc["gateway"] = gateway
    return config_from_dict(doc)


def watched(fleet: Fleet, capacity: Capacity, slos: SloSettings) -> tuple[dict[str, str], Config]:
    """Each replica's URL by name, and the headroom Config scraping the fleet (pool `m`: 16 slots,
    700 W a replica)."""
    urls = {r.name: f"http://{r.name}:8000/metrics" for r in fleet.pools["p"]}
    cfg = Config(vllm_targets=[Target(u) for u in urls.values()], gateways=list(GATEWAYS),
                 pools={"m": PoolSettings(max_num_seqs=16, watts_per_replica=700.0)}, capacity=capacity, slos=slos)
    return urls, cfg


def cycle_inputs(fleet: Fleet, urls: dict[str, str], cfg: Config, capacity, **extra) -> CycleInputs:
    """The fleet's pages at its clock, parsed as `collect` parses them (`capacity`: the CapacityState,
    which says how each gateway's labels read); `extra` goes to CycleInputs (statuses, forecast, ...)."""
    t = fleet.t
    readings = [readings_from_text(render_vllm(r, t), urls[r.name], t)[0] for r in fleet.pools["p"]]
    bodies = [render_gateway(fleet, t), render_app(fleet, t)]
    gateways = [read_gateway_scrape(body, capacity.gateway_config(src.kind, src.task_label, src.session_label),
                                    t, i, src.url, src.pool) for i, (src, body) in enumerate(zip(cfg.gateways, bodies))]
    extra.setdefault("statuses", [])
    return CycleInputs(readings, extra.pop("statuses"), gateways=gateways,
                       dcgm=[read_dcgm(render_dcgm(fleet, t), DCGM_URL)], **extra)
