"""What waits at a gateway that has no gauge for it: its arrivals x its latency, less the engines' (pure).

A gateway with neither a queue gauge nor an in-flight gauge (Envoy AI Gateway: only latency histograms;
monitor/derive/gateway_queues.py reads the others) still says how many requests it held on average
over the task window, by Little's law: the seconds of its calls finished in the window per second of
window (its call rate x its mean call latency; `gateway_in_flight`). The pool's engines held, by the
same law over the rate window, completion rate x mean end-to-end latency. What the gateways held
beyond that waited in front of the engines (`estimate_gateway_queues`):

    estimate = gateways' in flight - engines' (completion rate x mean e2e) - what queue or in-flight
               gauges already put on the pool, never below 0, shared by the gateways' in-flight

exported as `headroom_gateway_queued_requests{source="estimate"}` and counted in the load. It is an
average over the window (it lags a queue that just formed), a lower bound when callers also reach
the engines around the gateway, and unknown (absent) until the gateway has a reading one window
back or while the engines' completions or latency are.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from monitor.capacity.tasks import TaskWindow
from monitor.derive.counters import histogram_increase
from monitor.model import PoolSnapshot
from monitor.model.readings import GatewayReading, GatewayScrape

# gateway kinds whose bodies carry a queue or an in-flight gauge: never estimated
GAUGED = {"litellm", "llm-d", "dynamo", "app"}


def gateway_in_flight(newer: GatewayReading, older: Optional[GatewayReading]) -> Optional[float]:
    """Calls the gateway held on average between two readings (their latency seconds finished per
    second); None without an older reading, time between them, or a call latency histogram."""
    if older is None or newer.timestamp <= older.timestamp:
        return None
    seconds, seen = 0.0, False
    for tt, t in newer.tasks.items():
        old = older.tasks.get(tt)
        d = histogram_increase(t.call_latency, old.call_latency if old is not None else None) \
            if old is not None and old.call_latency is not None else None
        if d is None:
            continue
        seconds += max(0.0, d.sum)
        seen = True
    return seconds / (newer.timestamp - older.timestamp) if seen else None


def engines_in_flight(p: PoolSnapshot) -> Optional[float]:
    """The pool's engines' requests on average over the rate window: completion rate x mean e2e."""
    e2e = p.latency.get("e2e")
    if p.completion_rate is None or e2e is None or e2e.mean is None:
        return None
    return p.completion_rate * e2e.mean


def estimate_gateway_queues(pools: Sequence[PoolSnapshot], gateways: Sequence[GatewayScrape],
                            windows: Mapping[tuple[int, Optional[str]], TaskWindow]) -> None:
    """Add `gateway_queued[url]` ("estimate") to the pools the ungauged gateways feed; `windows`: the
    capacity layer's task windows, {(gateway index, pool): TaskWindow} (monitor/capacity/gateway_plan.py)."""
    by_name = {p.pool: p for p in pools}
    held: dict[str, dict[str, float]] = {}
    for scrape in gateways:
        if scrape.kept or scrape.reading is None or scrape.config.kind in GAUGED or scrape.reading.in_flight is not None:
            continue
        for (index, pool), window in windows.items():
            if index != scrape.index or pool not in by_name or not window.readings:
                continue
            older, covered = window.older()
            n = gateway_in_flight(window.readings[-1], older) if covered else None
            if n is not None:
                held.setdefault(pool, {})[scrape.url] = held.get(pool, {}).get(scrape.url, 0.0) + n
    for pool, urls in held.items():
        p = by_name[pool]
        engines = engines_in_flight(p)
        if engines is None:
            continue
        total = sum(urls.values())
        counted = sum(v for u, v in p.gateway_queued.items() if u not in urls)
        excess = max(0.0, total - engines - counted)
        for url, n in urls.items():
            p.gateway_queued[url] = excess * n / total if total > 0 else 0.0
            p.gateway_queued_source[url] = "estimate"


__all__ = ["GAUGED", "engines_in_flight", "estimate_gateway_queues", "gateway_in_flight"]
