"""What a digest is built from: per pool, its history series and the facts history does not carry."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pandas as pd

from monitor.digest.settings import TaskFacts


class DigestError(ValueError):
    """The digest cannot be built from this input; the message says why."""


@dataclass
class PoolInput:
    name: str
    series: dict[str, pd.Series]
    replicas: int
    knee_requests_per_replica: Optional[float]
    knee_source: str = "prior"  # learned | configured | prior | construction (monitor/digest/knee_report.py)
    knee_note: str = ""  # where the knee came from, in words
    gpus_per_replica: int = 1
    max_num_seqs: Optional[int] = None
    kv_capacity_tokens_per_replica: Optional[float] = None
    idle_watts_per_gpu: Optional[float] = None
    max_watts_per_gpu: Optional[float] = None
    tasks: dict[str, TaskFacts] = field(default_factory=dict)
    model: str = ""


@dataclass
class DigestInput:
    week_end: float  # Unix seconds; the digest covers [week_end - 7 d, week_end)
    pools: list[PoolInput]
    source: str = ""  # where the history came from (shown in the footer)
    step: Optional[float] = None  # seconds each history value covers (else the series' spacing)
    shard: Optional[tuple[int, int]] = None  # (index, total) of a sharded daemon: its pools only
