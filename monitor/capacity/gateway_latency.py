"""What the gateway adds to a call's latency: its call latency less the engines' end to end (pure).

    added = added_latency(gateway_quantiles, pool.latency["e2e"])

The gateway's call latency (LiteLLM `litellm_request_total_latency_metric`, Envoy AI Gateway
`gen_ai_server_request_duration_seconds`, llm-d `llm_d_epp_request_duration_seconds`) over the task
window, every task type of the readings fed to the pool merged (`gateway_call_histograms`), against
the engines' end-to-end latency over the latency window: the time a call spends before and after the
engines (the gateway's queue, a starved front end, the network). The mean's difference is the mean
added time; the quantiles' differences are differences of quantiles (a p95 of the gateway less a p95
of the engines), not the quantile of each call's own difference. Negative when the windows or the
calls measured differ (calls sent to the engines around the gateway): said as measured, not cut.
"""
from __future__ import annotations

from typing import Iterable, Optional

from monitor.derive import histogram as histo
from monitor.derive.counters import histogram_increase
from monitor.model import Histogram, Quantiles

FIELDS = ("p50", "p90", "p95", "p99", "mean")


def gateway_call_histograms(planned: Iterable[tuple], names: set) -> dict[str, Histogram]:
    """pool -> the increase of its gateways' call latency histograms over the task window (planned:
    monitor/capacity/gateway_plan.py `Planned`); a pool whose histograms do not merge is left out."""
    out: dict[str, Histogram] = {}
    bad: set = set()
    for pool, _cfg, reading, prev, *_ in planned:
        if pool is None or pool not in names:
            continue
        for tt, t in reading.tasks.items():
            old = prev.tasks.get(tt) if prev is not None else None
            d = _delta(t.call_latency, old.call_latency if old is not None else None)
            if d is None:
                continue
            merged = out[pool].plus(d) if pool in out else d
            if merged is None:
                bad.add(pool)
            else:
                out[pool] = merged
    return {p: h for p, h in out.items() if p not in bad and histo.total(h) > 0}


def gateway_call_totals(planned: Iterable[tuple], names: set) -> dict[str, Histogram]:
    """pool -> its gateways' cumulative call latency histograms merged (a pool target on `call`,
    slos.pools.<pool>.call_pNN_seconds, is judged on it by the SLO tracker, which takes resets)."""
    out: dict[str, Histogram] = {}
    bad: set = set()
    for pool, _cfg, reading, *_ in planned:
        if pool is None or pool not in names:
            continue
        for t in reading.tasks.values():
            if t.call_latency is None:
                continue
            merged = out[pool].plus(t.call_latency) if pool in out else t.call_latency
            if merged is None:
                bad.add(pool)
            else:
                out[pool] = merged
    return {p: h for p, h in out.items() if p not in bad}


def _delta(new: Optional[Histogram], old: Optional[Histogram]) -> Optional[Histogram]:
    """The window's increase (the cumulative histogram while there is no older reading, as the tasks')."""
    if new is None:
        return None
    return histogram_increase(new, old) if old is not None else new


def added_latency(gateway: Optional[Quantiles], engine: Optional[Quantiles]) -> Optional[Quantiles]:
    """The gateway's quantiles less the engines' (each field known on both sides), or None."""
    if gateway is None or engine is None:
        return None
    vals = {f: (getattr(gateway, f) - getattr(engine, f))
            for f in FIELDS if getattr(gateway, f) is not None and getattr(engine, f) is not None}
    if not vals:
        return None
    return Quantiles(**vals, count=gateway.count)


__all__ = ["added_latency", "gateway_call_histograms", "gateway_call_totals"]
