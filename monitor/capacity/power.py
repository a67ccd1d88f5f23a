"""GPU power per pool from DCGM exporter series (pure; monitor/sources/dcgm.py parses the bodies into
`DcgmReading`s, monitor/model/readings.py).

DCGM_FI_DEV_POWER_USAGE (watts, gauge; 1.x-compatibility name dcgm_power_usage) carries no pool. A
series joins a replica by, in order: `pod` (or 1.x `pod_name`), `Hostname` (releases up to 4.x),
`hostname` (newer), then the host of `instance`. Replicas offer their join keys: the host of their
scrape target and their pod / node / instance labels (`join_keys`). DCGM's blank sentinels (values
near 9.2e18) and NaN are skipped. Series that match no replica are reported, never guessed.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional
from urllib.parse import urlparse

from monitor.model.readings import POWER_NAMES

JOIN_LABELS = ("pod", "pod_name", "Hostname", "hostname", "instance")
SENTINEL = 9.0e18


def _host(value: str) -> str:
    """Host of an URL or host:port, lower-cased; the value itself otherwise."""
    v = value.strip()
    if "://" in v:
        v = urlparse(v).hostname or v
    elif v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.lower()


def join_keys(target: str, labels: Optional[dict] = None) -> set[str]:
    """Keys under which a replica can be found in DCGM labels."""
    keys = {_host(target)} if target else set()
    for name in ("pod", "pod_name", "node", "hostname", "Hostname", "instance", "host"):
        if labels and labels.get(name):
            keys.add(labels[name].lower() if name in ("pod", "pod_name") else _host(labels[name]))
    keys.discard("")
    return keys


def power_by_pool(samples: Iterable[tuple[str, dict, float]], key_to_pool: dict[str, Optional[str]],
                  first_label: Optional[str] = None) -> tuple[dict, int]:
    """Sum GPU watts per pool. Returns ({pool: watts}, unmatched series count).

    key_to_pool maps join keys (see key_map) to pool names; a key mapped to None is ambiguous (two
    pools share a node) and the next label of the series is tried.
    """
    out: dict[str, float] = {}
    unmatched = 0
    order = ((first_label,) if first_label else ()) + tuple(x for x in JOIN_LABELS if x != first_label)
    for name, labels, value in samples:
        if name not in POWER_NAMES:
            continue
        if value is None or math.isnan(value) or value >= SENTINEL or value < 0:
            continue
        pool = None
        for lab in order:
            v = labels.get(lab)
            if not v:
                continue
            key = v.lower() if lab in ("pod", "pod_name") else _host(v)
            if key_to_pool.get(key):
                pool = key_to_pool[key]
                break
        if pool is None:
            unmatched += 1
            continue
        out[pool] = out.get(pool, 0.0) + float(value)
    return out, unmatched


def key_map(replicas: Iterable[tuple[str, str, Optional[dict]]]) -> dict[str, Optional[str]]:
    """(pool, target, labels) of every replica -> {join key: pool}; a key of two pools maps to None."""
    out: dict[str, Optional[str]] = {}
    for pool, target, labels in replicas:
        for k in join_keys(target, labels):
            out[k] = pool if out.get(k, pool) == pool else None
    return out
