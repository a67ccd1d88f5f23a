"""The capacity sections of headroom.yml (`capacity:` and `pools:`), declared next to their owner
(monitor/capacity/enrich.py reads them); the `slos:` section is monitor/capacity/slo_settings.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from monitor.kit.settings.kinds import Choice, Duration, Int, Number, Text
from monitor.kit.settings.reader import key
from monitor.kit.settings.shapes import ListOf, MapOf
from monitor.kit.settings.values import DAY

from .slo_settings import PoolTargets

# The latency signals a knee is learned from, the one list (capacity/knee.py checks it, capacity/enrich.py
# reads it, capacity.knee_signal is one of them) -> the histogram each is read from (e2e_per_token: the
# e2e seconds over the generated tokens). Here, not in knee.py, so reading a configuration needs no numpy.
KNEE_SIGNAL_HISTOGRAM = {"queue": "queue", "ttft": "ttft", "e2e_per_token": "e2e", "e2e": "e2e", "itl": "itl"}
KNEE_SIGNALS = tuple(KNEE_SIGNAL_HISTOGRAM)
TASK_CLASSES = ("interactive", "deferrable", "batch")  # batch: the older name of deferrable
DEFERRABLE = frozenset(("deferrable", "batch"))


def _tokens_per_call(direction: str):
    """A pool's mean input or output tokens per model call: the digest prices a call with them."""
    return key(Number(gt=0, le=1e9), help=f"mean {direction} tokens per model call (the digest's cost per call)")


@dataclass
class PoolSettings:
    REMOVED: ClassVar[dict] = {"knee_margin": "removed: it was read but never used (the knee is learned "
                                             "from the data; the alert thresholds keep headroom free); delete it"}
    max_num_seqs: Optional[int] = key(Int(ge=1, le=1_000_000), help="vLLM --max-num-seqs per replica: the slots limit")
    watts_per_replica: Optional[float] = key(Number(gt=0, le=1e6), help="power per replica when DCGM gives none")
    replica_lead_time: Optional[float] = key(Duration(gt=0, le=DAY), help="how long a new replica takes to serve "
                                             "(scheduling, image pull, model load); alerts compare it with "
                                             "the time to exhaustion")
    slo: list = key(PoolTargets(), [], help="pool latency targets like {ttft_p95_seconds: 0.5} (docs/capacity.md)")
    # what the weekly digest needs that neither history nor the newest cycle carries (docs/digest.md)
    replicas: Optional[int] = key(Int(ge=1, le=1_000_000), help="replicas running, for the digest (default: "
                                  "the replicas headroom saw in its newest cycle)")
    gpus_per_replica: int = key(Int(ge=1, le=1024), 1, help="GPUs per replica (the digest's GPU-hours)")
    knee_requests_per_replica: Optional[float] = key(Number(gt=0, le=1e9), help="pins the digest's knee per "
                                                     "replica (else the one headroom learned, else a prior)")
    kv_capacity_tokens_per_replica: Optional[float] = key(Number(gt=0, le=1e12), help="KV-cache tokens per "
                                                          "replica, for the digest")
    idle_watts_per_gpu: Optional[float] = key(Number(gt=0, le=1e6), help="GPU power when idle (the digest's "
                                              "modelled power)")
    max_watts_per_gpu: Optional[float] = key(Number(gt=0, le=1e6), help="GPU power at full load (the digest's "
                                             "modelled power)")
    lmcache_cpu_bytes_per_replica: Optional[float] = key(Number(gt=0, le=1e16), help="LMCache's CPU cache "
                                                        "per replica in bytes (its max_local_cpu_size GB x 2^30 for "
                                                        "each worker, one per TP rank): LMCache reports the bytes "
                                                        "it holds, not its capacity")
    input_tokens_per_call: Optional[float] = _tokens_per_call("input")
    output_tokens_per_call: Optional[float] = _tokens_per_call("output")


@dataclass(frozen=True)
class Capacity:
    """The capacity enricher's knobs (monitor/capacity/enrich.py)."""

    knee_signal: str = key(Choice(KNEE_SIGNALS), "queue", help="latency signal the knee is found on")
    knee_min_span_seconds: float = key(Number(gt=0, le=DAY), 30.0, help="Little's-law window of one knee observation")
    min_confidence: float = key(Number(ge=0, le=1), 0.6, help="a learned knee is published above this confidence")
    min_change: float = key(Number(ge=0, le=10), 0.10, help="relative change needed to move a published knee")
    confirmations: int = key(Int(ge=1, le=1000), 3, help="fits in a row that must agree before the knee moves")
    min_observations: int = key(Int(ge=10, le=1_000_000), 30, help="observations before a knee is fitted")
    kv_tokens_per_request: Optional[float] = key(Number(gt=0, le=1e8),
                                                 help="KV tokens per request when none is running")
    active_requests_per_session: Optional[float] = key(Number(gt=0, le=1e6), help="session size when the pool is idle")
    task_pools: dict[str, str] = key(MapOf(Text(), names="task type"), {},
                                     help="task type -> pool (application metrics carry no pool)")
    task_classes: dict[str, str] = key(MapOf(Choice(TASK_CLASSES), names="task type"), {},
                                       help="task type -> call class: interactive (default; someone waits for it) or "
                                       "deferrable (can wait for spare capacity; batch is the same)")
    deferrable_priorities: list[str] = key(ListOf(Text()), [], help="engine priority values (SGLang's `priority` "
                                           "label) whose running requests are deferrable work, where no task "
                                           "type says (docs/spare-capacity.md)")
    spare_margin: float = key(Number(ge=0, lt=1), 0.2, help="spare capacity for deferrable work is counted below "
                              "knee x (1 - this) (docs/spare-capacity.md)")
    spare_max_age: float = key(Duration(gt=0, le=7 * DAY), 3600.0, help="a forecast older than this is stale: the "
                               "deferrable budget falls to 0")
    spare_budget_horizon: float = key(Duration(ge=60, le=DAY), 900.0, help="the deferrable budget holds the fewest "
                                      "spare requests over this long from now")
    task_window: Optional[float] = key(Duration(gt=0, le=DAY), help="task arrival rates, calls per task and "
                                       "sessions are counted over this window (default global.latency_window); "
                                       "make it several task durations long: unknown until covered")
