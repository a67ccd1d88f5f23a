"""prometheus_client collector over the latest snapshot, and the cached exposition bytes.

The exposition is rendered once per snapshot (not per scrape), so a scrape never queries a source
and never waits for a cycle in progress. Only the cadence (`Renderer.live`: the age of the last
cycle, on the monotonic clock) is rendered at each scrape and appended: it must grow while cycles
are stopped.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..catalogue import CATALOGUE
from ..kit.numbers import unsigned
from ..model import Snapshot
from .samples import Cadence, ProcessStatus, Renderer, Samples


class SnapshotCollector:
    """Yields fresh metric families from whatever `get_samples()` returns."""

    def __init__(self, get_samples: Callable[[], Samples]):
        self.get_samples = get_samples

    def collect(self) -> Iterable[Metric]:
        samples = self.get_samples()
        for mdef in CATALOGUE:
            rows = samples.get(mdef.name)
            if not rows:
                continue
            if mdef.type == "counter":
                fam = CounterMetricFamily(mdef.name, mdef.help)
            else:
                fam = GaugeMetricFamily(mdef.name, mdef.help)
            sample_name = fam.name + "_total" if mdef.type == "counter" else fam.name
            for lab, value in rows:  # the catalogue's labels and a pool key's (cluster=...: samples.py)
                fam.add_sample(sample_name, lab, unsigned(value))  # never -0.0 (monitor/kit/numbers.py)
            yield fam


class Exposition:
    """Holds the rendered /metrics body for the latest snapshot.

    `status()` gives what the daemon knows besides the cycle (its web server, the digest); it is
    read at each render. One `Renderer` per exposition keeps the cardinality cap's cut counts."""

    def __init__(self, status: Optional[Callable[[], Optional[ProcessStatus]]] = None,
                 cadence: Optional[Callable[[], Optional[Cadence]]] = None):
        self._lock = threading.Lock()
        self.renderer = Renderer()
        self.status = status or (lambda: None)
        self.cadence = cadence or (lambda: None)
        self._samples: Samples = self.renderer.render(None)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(lambda: self._samples))
        self.live_registry = CollectorRegistry(auto_describe=False)
        self.live_registry.register(SnapshotCollector(lambda: self.renderer.live(self.cadence())))
        self._body = generate_latest(self.registry)

    def update(self, snapshot: Optional[Snapshot]) -> None:
        with self._lock:
            self._samples = self.renderer.render(snapshot, self.status())
            self._body = generate_latest(self.registry)

    def body(self) -> bytes:
        """The snapshot's cached body (an immutable reference: no lock) and the cadence, rendered now."""
        return self._body + generate_latest(self.live_registry)

    def samples(self) -> Samples:
        return self._samples
