"""The one pass that turns an engine's parsed `/metrics` into `ReplicaReading`s, driven by the engine's
tables (monitor/sources/vllm.py `VLLM`, sglang.py `SGLANG`).

An `Engine` says which family fills which reading field: its gauge steps (the few special cases of
that engine, small named functions, run in order), its counters and histograms (canonical key ->
candidate sample names, first present wins) and how one family's samples fold into the readings,
then its closing steps. `read` runs them in that order over one `Replicas`, the readings by model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from monitor.kit.exposition import ParsedScrape

from ..model import ReplicaReading

Rows = list[tuple[dict[str, str], float]]


@dataclass
class Replicas:
    """The readings of one scrape, one per model in the order first read, and what the pass learns
    on the way: each model's engine ids, the (what, model, engine) already counted, the naming."""

    scrape: ParsedScrape
    target: str
    timestamp: float
    target_labels: Optional[dict[str, str]]
    naming: str  # the ReplicaReading.naming a new reading starts with
    engines_at_start: Optional[int] = None  # a new reading's `engines` (vLLM counts them: 0), or the default
    by_model: dict[str, ReplicaReading] = field(default_factory=dict)
    engines: dict[str, set[str]] = field(default_factory=dict)
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    unknown_kv: set[str] = field(default_factory=set)  # models whose live KV is unknown (an engine's unusable)

    def reading(self, model: str) -> ReplicaReading:
        r = self.by_model.get(model)
        if r is None:
            r = ReplicaReading(target=self.target, model=model, timestamp=self.timestamp,
                               labels=dict(self.target_labels or {}), naming=self.naming)
            if self.engines_at_start is not None:
                r.engines = self.engines_at_start
            self.by_model[model] = r
        return r

    def first(self, what: str, model: str, engine: str) -> bool:
        """Whether this (what, model, engine) is read for the first time; a repeat is the anomaly
        `duplicate_engine` (the same engine id twice: the first one counts)."""
        key = (what, model, engine)
        if key in self.seen:
            self.scrape.anomaly("duplicate_engine")
            return False
        self.seen.add(key)
        return True


Step = Callable[[ParsedScrape, Replicas], None]
Fold = Callable[[ParsedScrape, str, str, Replicas], None]  # (scrape, canonical key, sample name, replicas)


@dataclass(frozen=True)
class Engine:
    """One engine's tables: what the pass reads, in order, and how."""

    naming: str
    gauges: tuple[Step, ...]  # the gauge fields, each a named step
    counters: dict[str, tuple[str, ...]]  # canonical counter key -> candidate sample names
    counter: Fold  # how one counter family's samples fold into the readings
    histograms: dict[str, tuple[str, ...]]  # canonical histogram key -> candidate base names
    histogram: Fold  # how one histogram family (its base name) folds into the readings
    closing: tuple[Step, ...]  # after the families: per-reading totals, overflow, edges
    engines_at_start: Optional[int] = None


def families(scrape: ParsedScrape, table: dict[str, tuple[str, ...]], suffix: str = "") -> Iterator[tuple[str, str]]:
    """(key, name) of each key's first candidate with a sample (`name + suffix`: a histogram's _bucket)."""
    for key, candidates in table.items():
        for name in candidates:
            if scrape.get(name + suffix):
                yield key, name
                break


def read(engine: Engine, scrape: ParsedScrape, target: str, timestamp: float,
         target_labels: Optional[dict[str, str]] = None) -> list[ReplicaReading]:
    """One ReplicaReading per model served by the target, as the engine's tables say."""
    replicas = Replicas(scrape, target, timestamp, target_labels, engine.naming, engine.engines_at_start)
    for step in engine.gauges:
        step(scrape, replicas)
    for key, name in families(scrape, engine.counters):
        engine.counter(scrape, key, name, replicas)
    for key, base in families(scrape, engine.histograms, "_bucket"):
        engine.histogram(scrape, key, base, replicas)
    for step in engine.closing:
        step(scrape, replicas)
    return list(replicas.by_model.values())


SUMMED_FIELDS = ("running", "waiting", "kv_capacity_tokens", "kv_live_tokens", "kv_usage")


def unknown_if_overflowed(scrape: ParsedScrape, r: ReplicaReading) -> None:
    """Engines' (and series') values are each finite (`checked`); a sum of them that overflowed to
    +Inf is unknown (None), counted once per reading as the anomaly `overflow`, never +Inf."""
    over = [name for name in SUMMED_FIELDS if getattr(r, name) is not None and not math.isfinite(getattr(r, name))]
    if {"kv_capacity_tokens", "kv_live_tokens"} & set(over):
        over.append("kv_usage")  # live / capacity: unknown with either
    for name in over:
        setattr(r, name, None)
    for table in (r.waiting_by_reason, r.counters):
        for key in [k for k, v in table.items() if not math.isfinite(v)]:
            del table[key]
            over.append(key)
    if over:
        scrape.anomaly("overflow")


def overflow_step(scrape: ParsedScrape, replicas: Replicas) -> None:
    for r in replicas.by_model.values():
        unknown_if_overflowed(scrape, r)
