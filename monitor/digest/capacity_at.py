"""A pool's capacity at one instant of its history, as the daemon would have computed it then:
the load, the knee the digest uses, power (measured, else modelled from utilisation) and sessions."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from monitor.capacity.headroom import CapacitySettings, compute_capacity
from monitor.capacity.knee import Knee
from monitor.digest.inputs import PoolInput
from monitor.model import PoolSnapshot


def snapshot_at(p: PoolInput, at: float, load: pd.Series) -> PoolSnapshot:
    def val(name):
        s = p.series.get(name)
        if s is None or s.empty:
            return None
        idx = s.index.to_numpy()
        j = int(np.searchsorted(idx, at, side="right")) - 1
        return float(s.iloc[max(j, 0)])
    kv_cap = (p.kv_capacity_tokens_per_replica * p.replicas) if p.kv_capacity_tokens_per_replica else None
    return PoolSnapshot(pool=p.name, model=p.model, replicas=p.replicas, replicas_configured=p.replicas,
                        active_requests=val("active_requests") or 0.0,
                        queued_requests=val("queued_requests") or 0.0,
                        kv_tokens_live=val("kv_tokens"), kv_tokens_capacity=kv_cap)


def power_model(p: PoolInput, load: pd.Series, cap: Optional[float]) -> Optional[pd.Series]:
    if "power_watts" in p.series:
        return p.series["power_watts"]
    if p.idle_watts_per_gpu is None or p.max_watts_per_gpu is None or not cap:
        return None
    util = np.clip(load.to_numpy() / cap, 0.0, 1.0)
    w = p.replicas * p.gpus_per_replica * (p.idle_watts_per_gpu + (p.max_watts_per_gpu - p.idle_watts_per_gpu) * util)
    return pd.Series(w, index=load.index)


def capacity_at(p: PoolInput, at: float, load: pd.Series, power: Optional[pd.Series]) -> dict:
    snap = snapshot_at(p, at, load)
    knee = Knee(p.knee_requests_per_replica, None, p.knee_source,
                "limits" if p.knee_source != "learned" else "queue")
    sessions = None
    if "sessions" in p.series:
        sessions = value_at(p.series["sessions"], at)
    pw = value_at(power, at) if power is not None else None
    watts = (p.max_watts_per_gpu * p.gpus_per_replica) if p.max_watts_per_gpu else None
    c = compute_capacity(snap, knee, CapacitySettings(max_num_seqs=p.max_num_seqs, watts_per_replica=watts),
                         power_watts=pw, sessions=sessions)
    return {
        "timestamp": at, "load_requests": c["load_requests"],
        "capacity_requests": c["capacity_requests"], "limiting_factor": c["limiting_factor"],
        "utilisation_ratio": c["utilisation_ratio"], "ratio": c["ratio"],
        "headroom_requests": c["headroom_requests"], "sessions": c["sessions"],
        "session_capacity": c["session_capacity"], "power_watts": c["power_watts"],
        "sessions_per_megawatt": c["sessions_per_megawatt"],
    }


def value_at(s: Optional[pd.Series], at: float) -> Optional[float]:
    if s is None or s.empty:
        return None
    j = int(np.searchsorted(s.index.to_numpy(), at, side="right")) - 1
    return float(s.iloc[max(j, 0)])
