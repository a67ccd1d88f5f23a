"""prometheus_client collector over the latest snapshot, and the cached exposition bytes.

The exposition is rendered once per snapshot (not per scrape), so a scrape never queries a source
and never waits for a cycle in progress. Only the cadence (`Renderer.live`: the age of the last
cycle, on the monotonic clock) and the render errors are rendered at each scrape and appended: they
must move while cycles are stopped or while the body cannot be rendered.

A part of a render that fails is dropped and counted (monitor/export/samples.py); a render that
fails altogether keeps the previous body, counts `headroom_render_errors_total{family="all"}`, and
says so in `failure` (/-/ready answers 503 with it), and from then on the cadence's age is the age
of the body served, not of the last cycle: a frozen body never claims to be fresh
(HeadroomCyclesStopped sees it grow).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..kit.numbers import unsigned
from ..model import Snapshot
from ..model.catalogue import CATALOGUE
from .samples import Cadence, ProcessStatus, Renderer, Samples

log = logging.getLogger(__name__)


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
            fam: Metric
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
                 cadence: Optional[Callable[[], Optional[Cadence]]] = None,
                 monotonic: Callable[[], float] = time.monotonic):
        self._lock = threading.Lock()
        self.renderer = Renderer()
        self.status = status or (lambda: None)
        self.cadence = cadence or (lambda: None)
        self.monotonic = monotonic
        self.failure: Optional[str] = None  # why the last render failed altogether; None when it did not
        self._failed_since: Optional[float] = None  # self.monotonic() of the body served when a render failed
        self._body_at: Optional[float] = None  # self.monotonic() when the body served was rendered
        self._samples: Samples = self.renderer.render(None)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(lambda: self._samples))
        self.live_registry = CollectorRegistry(auto_describe=False)
        self.live_registry.register(SnapshotCollector(lambda: self.renderer.live(self.served_cadence())))
        self._body = generate_latest(self.registry)

    def update(self, snapshot: Optional[Snapshot]) -> bool:
        """Render `snapshot` into the body served; False (the previous body kept, counted, `failure`
        set) when that fails altogether."""
        with self._lock:
            previous = self._samples
            try:
                self._samples = self.renderer.render(snapshot, self.status())
                body = generate_latest(self.registry)
            except Exception as exc:  # noqa: BLE001 -- the body served stays whole, the failure is said
                self._samples = previous
                self.renderer.errors["all"] = self.renderer.errors.get("all", 0.0) + 1
                if self.failure is None:
                    self._failed_since = self._body_at if self._body_at is not None else self.monotonic()
                    log.error("the snapshot could not be rendered; /metrics keeps the previous body and "
                              "/-/ready answers 503: %s: %s", type(exc).__name__, str(exc)[:300])
                self.failure = f"the last snapshot could not be rendered ({type(exc).__name__})"
                return False
            self._body = body
            self._body_at = self.monotonic()
            if self.failure is not None:
                log.info("snapshots render again")
            self.failure, self._failed_since = None, None
            return True

    def served_cadence(self) -> Optional[Cadence]:
        """The cycle's cadence as the body served shows it: while renders fail, the age is the age
        of the body served (or since the first failure, before any body), never the last cycle's."""
        cadence = self.cadence()
        if self.failure is None or cadence is None:
            return cadence
        since = self._failed_since
        stale = None if since is None else self.monotonic() - since
        age = cadence.last_cycle_age_seconds
        return Cadence(stale if age is None else max(age, stale or 0.0), cadence.interval_seconds)

    def body(self) -> bytes:
        """The snapshot's cached body (an immutable reference: no lock) and the cadence, rendered now."""
        return self._body + generate_latest(self.live_registry)

    def samples(self) -> Samples:
        return self._samples
