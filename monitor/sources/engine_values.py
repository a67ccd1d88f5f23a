"""Values read from an engine's series, checked: numbers from label text, engine ids, model names and
the bounds past which a value is refused (monitor/sources/vllm.py, vllm_tiers.py and sglang.py)."""
from __future__ import annotations

import math
from typing import Optional

from monitor.kit.exposition import ParsedScrape


def _num(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        v = float(value)
    except ValueError:
        return None  # "None" and friends
    return v if math.isfinite(v) else None


def _engine(labels: dict[str, str]) -> str:
    """The engine a series belongs to: its `engine` label, within its Ray Serve replica when the
    series came through Ray (`ReplicaId`: one Ray node's metrics agent serves every replica on it;
    they are read as engines of one target, summed like data-parallel engines)."""
    engine = labels.get("engine", "")
    replica = labels.get("ReplicaId")
    return f"{replica}/{engine}" if replica else engine


def _model_of(labels: dict[str, str]) -> Optional[str]:
    return labels.get("model_name")


# The most a replica's series can sanely say; past it a value is refused (`out_of_range`), never used:
MAX_REQUESTS = 1e6  # requests running or waiting on one replica (vLLM's max_num_seqs is in the hundreds)
MAX_TOKENS = 1e12  # KV tokens of one replica (a few million on the largest GPUs today)
MAX_COUNT = 2.0 ** 53  # a counter past this cannot count by 1 any more (a float's exact integers)


def checked(scrape: ParsedScrape, value: float, high: Optional[float] = None) -> Optional[float]:
    """A count, fraction or counter fit to use, or None: NaN and +-Inf are `non_finite`, a value
    below 0 is `negative`, one above `high` is `out_of_range`, each counted in the scrape's
    anomalies. None means unknown for that replica, never 0."""
    if not math.isfinite(value):
        scrape.anomaly("non_finite")
        return None
    if value < 0:
        scrape.anomaly("negative")
        return None
    if high is not None and value > high:
        scrape.anomaly("out_of_range")
        return None
    return value
