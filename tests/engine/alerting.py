"""A headroom daemon and a real Prometheus on the demo-scale rules: the alerting stack of the engine
tier (tests/engine/test_journey_vllm.py).

`demo_scale_rules` writes the bundled rule files on the demo's time scale (lab/headroom_lab/commands/demo.py
`demo_rules`, as `make demo` runs them): every `for:` SHORTENED 30x, and every range window of an
alert expression with it (10m -> 20s, 5m -> 10s), each group evaluated every second, so the same
expressions - the mean of a window held for a `for:` - play out in seconds.

    with alerting_stack(cfg, tmp_path) as stack:       # cfg: a headroom.yml as a dict
        stack.prom.wait_for('headroom_ratio{pool="tiny"} == 1')
        alert_states(stack.prom, "tiny", ("HeadroomLow",))   # {"HeadroomLow": ("firing", "warning")}

The daemon cycles on `cfg`'s interval; Prometheus scrapes it and evaluates every second. Both are
stopped when the block ends, whatever happened in it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import requests
import yaml
from servers import Prometheus, wait_http

ROOT = Path(__file__).resolve().parents[2]
FACTOR = 30  # the demo's DEMO_FOR_FACTOR: `for:` and range windows on a 30x shorter time scale


def demo_scale_rules(workdir: Path) -> list[str]:
    """The bundled rule files on the demo's time scale (`demo_rules`: every alert's `for:` and range
    windows / 30), evaluated every second; the paths written."""
    from headroom_lab.commands.demo import demo_rules
    out = demo_rules(sorted(str(p) for p in (ROOT / "rules").glob("*.yaml")), str(workdir), factor=FACTOR)
    for path in out:
        doc = yaml.safe_load(Path(path).read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
        Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))
    low = next(r for p in out for g in yaml.safe_load(Path(p).read_text())["groups"] for r in g["rules"]
               if r.get("alert") == "HeadroomLow")
    assert low["for"] == "20s" and "[10s]" in low["expr"], low  # shortened: for 10m -> 20s, mean over 5m -> 10s
    return out


@dataclass
class AlertingStack:
    prom: Prometheus
    daemon_port: int


@contextmanager
def alerting_stack(cfg: dict, workdir: Path) -> Iterator[AlertingStack]:
    """A headroom daemon built from `cfg` (written to workdir/headroom.yml) and a Prometheus scraping it
    every second with the demo-scale rules; both stopped on the way out."""
    from monitor.app import build
    from monitor.config import from_dict
    (workdir / "headroom.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    daemon = build(from_dict(cfg, str(workdir / "headroom.yml")), "127.0.0.1:0")
    daemon.start()
    prom: Optional[Prometheus] = None
    try:
        wait_http(f"http://127.0.0.1:{daemon.port}/metrics", timeout=30)
        rules = workdir / "rules"
        rules.mkdir()
        prom_cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": demo_scale_rules(rules),
                    "scrape_configs": [{"job_name": "headroom",
                                        "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]}]}
        prom = Prometheus(str(workdir), yaml.safe_dump(prom_cfg, sort_keys=False))
        yield AlertingStack(prom=prom, daemon_port=daemon.port)
    finally:
        if prom is not None:
            prom.stop()
        daemon.stop()


def alerts(prom: Prometheus) -> list[dict]:
    r = requests.get(prom.url + "/api/v1/alerts", timeout=10)
    r.raise_for_status()
    return r.json()["data"]["alerts"]


def alert_states(prom: Prometheus, pool: str, names) -> dict[str, tuple[str, str]]:
    """alertname -> (state, severity) of the alerts named `names` on `pool` (the worst state of an
    alert's copies: firing over pending)."""
    out: dict = {}
    for a in alerts(prom):
        lab = a["labels"]
        if lab.get("pool") == pool and lab["alertname"] in names:
            if out.get(lab["alertname"], ("",))[0] != "firing":
                out[lab["alertname"]] = (a["state"], lab.get("severity"))
    return out


def value(prom: Prometheus, q: str) -> Optional[float]:
    """The first sample of an instant query, or None when it returns nothing."""
    res = prom.query(q)
    return float(res[0]["value"][1]) if res else None
