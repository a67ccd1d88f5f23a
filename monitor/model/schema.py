"""The history schema: one name and one meaning per series, whoever writes or reads it.

Every history in headroom - the embedded store (direct mode), Prometheus (Prometheus mode), the
simulated fortnight of the demo - is a set of per-pool series with these names:

| series                            | meaning, per pool                          | unit     | per step | Prometheus: headroom's series | Prometheus: vLLM's (fallback)       |
| --------------------------------- | ------------------------------------------ | -------- | -------- | ----------------------------- | ----------------------------------- |
| `active_requests`                 | requests in the running batches, no queue  | requests | max      | `headroom_active_requests`    | `vllm:num_requests_running`         |
| `queued_requests`                 | requests waiting in the engine queues      | requests | max      | `headroom_queued_requests`    | `vllm:num_requests_waiting`         |
| `load`                            | active + queued at the same instant        | requests | max      | the two above, added          | running + waiting                   |
| `offered`                         | active + unserved arrivals x service time  | requests | max      | `headroom_offered_requests`   | -                                   |
| `kv_tokens`                       | live KV-cache tokens                       | tokens   | max      | `headroom_kv_tokens`          | usage x `kv_cache_size_tokens`      |
| `sessions`                        | concurrent agent sessions                  | sessions | max      | `headroom_sessions`           | -                                   |
| `arrival_rate`                    | model calls finished per second            | 1/s      | mean     | `headroom_completion_rate`    | `rate(vllm:request_success_total)`  |
| `power_watts`                     | GPU power                                  | W        | mean     | `headroom_power_watts`        | -                                   |
| `task_arrivals:<task_type>`       | tasks started per second                   | 1/s      | mean     | `headroom_task_arrival_rate`  | -                                   |
| `task_completions:<task_type>`    | tasks completed per second                 | 1/s      | mean     | `headroom_task_completion_rate`| -                                  |
| `slo_violation_ratio:<task_type>` | share of tasks over their latency target   | ratio    | max      | `headroom_slo_violation_ratio`| -                                   |
| `task_latency:<task_type>`        | task latency per interval (demo estimate)  | s        | max      | -                             | -                                   |

vLLM's series are summed over the pool's engines (by `model_name`, or the label pools are made of);
headroom's are one series per pool (`max by (pool)`: an HA pair's two copies are not added). The
store (direct mode) holds the same names, written by `monitor.history.store.points_from_snapshot`.
`load` is what the knee and the capacity are compared with (the forecasts' capacity series, the
digest's load); arrivals equal completions on average, which is what `arrival_rate` measures.

`offered` is the demand, not only the service: the active requests plus the arrivals not served
(headroom_shed_requests_rate and the queue's growth) times their mean service time (monitor/model/
`PoolSnapshot.offered_requests`). When it is there, the forecasts' capacity series is `offered`, and
`load` (the served load) is forecast beside it (monitor/forecast/pool.py).

`load` is its own series, not a sum of the two peaks: the peak of active + queued within a step is
at most, and usually less than, the peak of active plus the peak of queued.

Steps (the same for every reader): a history read over [start, end) with step `s` holds one value per
*complete* bucket [b, b + s), b a multiple of s with start <= b and b + s <= end, indexed by b (Unix
seconds, float). The value is the bucket's maximum ("max") or mean ("mean") as the table says. A
bucket with nothing in it is absent (never 0, never NaN).

Readers return `{pool: {series: pandas.Series}}` (see `HistorySource`). Nothing here reads a clock.

The SLO burn windows' history (direct mode) is not a series of values per step but the SLO tracker's
cumulative counts (monitor/capacity/slo.py `SloTracker`), kept in the store's table `slo_counts`,
written and read by monitor/history/slo_history.py only; about 1,000 points per key cover 3 days:

| column      | meaning                                                                        |
| ----------- | ------------------------------------------------------------------------------ |
| `key`       | the tracker's key as JSON: `[pool, task type or "pool:<signal>", "<signal><=<seconds>"]` |
| `ts`        | the cycle's time, milliseconds since the epoch                                 |
| `total`     | observations so far, rebased over counter resets                               |
| `bad`       | observations over the target so far, rebased over counter resets               |
| `raw_total` | the total as read this cycle (a drop is a counter reset)                       |
| `raw_bad`   | the bad count as read this cycle                                               |

In Prometheus mode the windows are read from Prometheus' histograms instead (monitor/history/slo_history.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol

import pandas as pd


@dataclass(frozen=True)
class Spec:
    name: str
    meaning: str
    unit: str
    agg: str  # "max" (peak per step) or "mean"
    per_task: bool = False  # stored as "<name>:<task_type>"
    metric: Optional[str] = None  # headroom's exported metric that records it


_SPECS = (  # the docstring's table, row by row (a test holds them equal)
    Spec("active_requests", "requests in the running batches, no queue", "requests", "max",
         metric="headroom_active_requests"),
    Spec("queued_requests", "requests waiting in the engine queues", "requests", "max",
         metric="headroom_queued_requests"),
    Spec("load", "active + queued at the same instant", "requests", "max"),
    Spec("offered", "active + unserved arrivals x service time", "requests", "max",
         metric="headroom_offered_requests"),
    Spec("kv_tokens", "live KV-cache tokens", "tokens", "max", metric="headroom_kv_tokens"),
    Spec("sessions", "concurrent agent sessions", "sessions", "max", metric="headroom_sessions"),
    Spec("arrival_rate", "model calls finished per second", "1/s", "mean", metric="headroom_completion_rate"),
    Spec("power_watts", "GPU power", "W", "mean", metric="headroom_power_watts"),
    Spec("task_arrivals", "tasks started per second", "1/s", "mean", per_task=True,
         metric="headroom_task_arrival_rate"),
    Spec("task_completions", "tasks completed per second", "1/s", "mean", per_task=True,
         metric="headroom_task_completion_rate"),
    Spec("slo_violation_ratio", "share of tasks over their latency target", "ratio", "max", per_task=True,
         metric="headroom_slo_violation_ratio"),
    Spec("task_latency", "task latency per interval (demo estimate)", "s", "max", per_task=True),
)
SERIES: dict[str, Spec] = {s.name: s for s in _SPECS}
# the store's `slo_counts` table, column by column (the docstring's second table; a test holds both)
SLO_COUNTS_COLUMNS = ("key", "ts", "total", "bad", "raw_total", "raw_bad")
TASK_LABEL = "task_type"


def key(name: str, task: Optional[str] = None) -> str:
    """The series key: `name`, or `name:<task>` for a per-task series."""
    spec = SERIES.get(name)
    if spec is None:
        raise ValueError(f"unknown history series {name!r}; known: {', '.join(SERIES)}")
    if spec.per_task != bool(task):
        raise ValueError(f"series {name!r} {'needs' if spec.per_task else 'takes no'} task type")
    return f"{name}:{task}" if task else name


def parse(series_key: str) -> tuple[Spec, Optional[str]]:
    """(spec, task type or None) of a series key; ValueError naming it when unknown."""
    name, _, task = series_key.partition(":")
    spec = SERIES.get(name)
    if spec is None or spec.per_task != bool(task):
        raise ValueError(f"unknown history series {series_key!r}; known: "
                         f"{', '.join(s.name + (':<task_type>' if s.per_task else '') for s in _SPECS)}")
    return spec, task or None


def is_known(series_key: str) -> bool:
    try:
        parse(series_key)
    except ValueError:
        return False
    return True


def names(wanted: Optional[Iterable[str]]) -> tuple[str, ...]:
    """Checked series names (per-task ones without the task part); None means all of them."""
    if wanted is None:
        return tuple(SERIES)
    out = tuple(wanted)
    for n in out:
        if n not in SERIES:
            raise ValueError(f"unknown history series {n!r}; known: {', '.join(SERIES)}")
    return out


@dataclass(frozen=True)
class Window:
    first: float  # start of the first complete bucket
    step: float
    count: int  # complete buckets

    @property
    def end(self) -> float:
        """End of the last complete bucket (first + count x step)."""
        return self.first + self.count * self.step


def window(start: float, end: float, step: float) -> Window:
    """The complete buckets [b, b + step) of [start, end), b a multiple of `step`."""
    if not (isinstance(step, (int, float)) and math.isfinite(step) and step > 0):
        raise ValueError(f"step must be a positive number of seconds, got {step!r}")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"start and end must be finite, got {start!r}, {end!r}")
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    first = math.ceil(start / step) * step
    count = max(0, math.floor((end - first) / step + 1e-9))
    return Window(float(first), float(step), count)


def to_series(points: dict[float, float]) -> pd.Series:
    """{ts: value} -> the schema's Series: float index sorted, float values."""
    return pd.Series(points, dtype=float).sort_index() if points else pd.Series(
        [], dtype=float, index=pd.Index([], dtype=float))


History = dict[str, dict[str, pd.Series]]


class HistorySource(Protocol):
    """What the forecasts and the digest read history through (store- or Prometheus-backed)."""

    describe: str  # where the history comes from, for messages and the digest footer

    def load(self, pools: Optional[Iterable[str]], start: float, end: float, step: float,
             series: Optional[Iterable[str]] = None) -> History:
        """{pool: {series key: Series}} over the complete buckets of [start, end): every pool
        (or `pools`), every schema series (or those named in `series`) that has a value."""
        ...
