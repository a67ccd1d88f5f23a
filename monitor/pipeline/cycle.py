"""One collection cycle: collect (I/O and parsing) -> step (pure) -> publish.

    inputs = pipeline.collect(now)               # every source at once, until the cycle deadline
    state, snapshot = step(state, inputs, now)   # monitor/step/cycle_step.py: derive, capacity, the forecast
    pipeline.publish(snapshot)                   # one reference swap, then the listeners

`collect` does all the cycle's I/O and parsing and returns a `CycleInputs` (plain data: replica
readings, source statuses, gateway and DCGM readings (monitor/model/readings.py; the gateways, DCGM
exporters and alerts source are read by monitor/sources/auxiliary.py), input anomalies, the
forecaster's latest result). `step` is a pure function of the state kept between cycles, those
inputs and `now`; it reads no clock and no source. `Pipeline` owns the sources and the state, and publishes each
finished `Snapshot` atomically for the exporter. Cycles never overlap: a cycle that finds the
previous one still running is skipped and counted.

The wall clock may step (an NTP step, a VM resumed): each cycle compares how far the wall clock
moved since the previous cycle with how far the boot-time clock did (it never steps, and counts a
suspend). A difference over `CLOCK_STEP_TOLERANCE` is a step: logged once, counted
(`clock_steps`), and the state is moved onto the new clock (`CycleState.shift_time`) so rates,
windows and knees keep measuring true durations; listeners (`on_clock_step`) do the same for what
they keep (the store drops points stamped after the new now: no future stamp is kept). The cadence
itself never depends on the wall clock (monitor/kit/ticker.py), and `cycle_age()` is monotonic, so
/metrics and /-/ready tell that cycles stopped even when Prometheus shares a stepped clock.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterable, Optional

from monitor.kit.http import BodyBudget, Fetcher
from monitor.kit.text import valid_text
from monitor.kit.ticker import steady_clock

from ..capacity.enrich import CapacityState
from ..history.slo_history import prometheus_windows
from ..model import RefitResult, ReplicaReading, Snapshot, SourceStatus
from ..model.poolkey import normalise
from ..model.readings import GatewayConfig
from ..sources.auxiliary import AuxSources
from ..sources.auxiliary import late as _late
from ..sources.deadline_pool import DeadlinePool, Late
from ..sources.gateway_pace import gateway_timeout
from ..sources.prometheus_reader import PrometheusRead, PrometheusSourceReader
from ..sources.scrape import Scraper
from ..sources.settings import AlertsSource, GatewaySource, HttpAuth, PrometheusSource, Target
from ..step.cycle_state import CycleInputs, CycleState, StepSettings, count_into
from ..step.cycle_step import step

log = logging.getLogger(__name__)

DEADLINE_MARGIN = 0.5  # seconds a cycle waits beyond its sources' request timeouts
CLOCK_STEP_TOLERANCE = 1.0  # seconds the wall clock may drift from the boot-time clock between cycles


class _Texts:
    """valid_text, counting the texts it had to change."""

    def __init__(self) -> None:
        self.replaced = 0

    def __call__(self, text):
        if not isinstance(text, str) or text.isascii():
            return text
        fixed = valid_text(text)
        self.replaced += fixed is not text
        return fixed

    def labels(self, labels: dict) -> dict:
        return {self(k): self(v) for k, v in labels.items()}


def valid_inputs(inputs: CycleInputs) -> None:
    """Label values are data: what a JSON answer may carry that cannot be written (a lone surrogate,
    `"\\ud800"`, in a label of the query layer or in an alert's text) is replaced with U+FFFD where it
    comes in, before it becomes a pool key, a label, the page or the JSON, and counted (input anomaly
    `invalid_text`, one per text). Plain ASCII, nearly everything, is passed over at once."""
    fix = _Texts()
    for i, r in enumerate(inputs.readings):
        if not (r.model.isascii() and r.target.isascii() and all(v.isascii() for v in r.labels.values())):
            inputs.readings[i] = replace(r, model=fix(r.model), target=fix(r.target), labels=fix.labels(r.labels))
    for i, st in enumerate(inputs.statuses):
        if not (st.target.isascii() and (st.detail or "").isascii()):
            inputs.statuses[i] = replace(st, target=fix(st.target), detail=fix(st.detail))
    if inputs.alerts:
        inputs.alerts = [replace(a, name=fix(a.name), severity=fix(a.severity), pool=fix(a.pool), summary=fix(a.summary),
                                 labels=fix.labels(a.labels)) for a in inputs.alerts]
    for attr in ("pool_histograms", "pool_totals"):
        held = getattr(inputs, attr)
        if held and not all(isinstance(k, str) and k.isascii() for k in held):
            setattr(inputs, attr, {fix(k): v for k, v in held.items()})
    if fix.replaced:
        count_into(inputs.anomalies, {"invalid_text": float(fix.replaced)})


@dataclass(frozen=True)
class PipelineSettings:
    """What the `Pipeline` reads of the configuration: its sources' sections, the `global:` keys of a
    cycle, the latency signals with a pool SLO, and the pure step's settings (whose pool_by,
    forget_after, latency_window, shard and max_series the Prometheus reader reads too). The
    application builds it from its Config (monitor/config/inputs.py `pipeline_settings`)."""

    step: StepSettings
    interval: float  # global.interval
    scrape_timeout: float  # global.scrape_timeout
    scrape_concurrency: int  # global.scrape_concurrency
    scrape_memory_mib: int  # global.scrape_memory_mib: every source's bodies in flight share it
    vllm_targets: tuple[Target, ...]  # sources.vllm.targets
    vllm_auth: HttpAuth  # sources.vllm's credentials
    prometheus: Optional[PrometheusSource]  # sources.prometheus (Prometheus mode)
    gateways: tuple[GatewaySource, ...]  # sources.gateways
    dcgm_targets: tuple[Target, ...]  # sources.dcgm.targets
    alerts: Optional[AlertsSource]  # sources.alerts
    # the latency signals with a pool SLO (slos: pools, pools.<name>.slo): Prometheus mode reads their
    # cumulative buckets per pool, only those around the targets' seconds (`slo_seconds`: signal -> seconds)
    slo_signals: tuple[str, ...]
    slo_seconds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    slo_pools: Optional[dict[str, tuple[str, ...]]] = None  # pool -> its SLO's signals; None: every pool, every signal


def cycle_deadline_seconds(settings: PipelineSettings) -> float:
    """How long a cycle waits for its sources before it publishes what it has.

    A little over the longest request timeout in use (every request ends by then, see
    sources/http.py), and never more than 90% of the interval: one stuck source cannot hold the
    cycle of the whole fleet.
    """
    timeouts = [settings.prometheus.timeout] if settings.prometheus else []
    if settings.vllm_targets or settings.gateways or settings.dcgm_targets:
        timeouts.append(settings.scrape_timeout)
    timeouts += [gateway_timeout(gw, settings.scrape_timeout, settings.interval)  # a gateway's own (a slow LiteLLM's)
                 for gw in settings.gateways]
    return max(0.05, min(0.9 * settings.interval, max(timeouts, default=0.0) + DEADLINE_MARGIN))


class Pipeline:
    """The sources, the state between cycles and the published snapshot.

    settings: what it reads of the configuration (`pipeline_settings(cfg)`, monitor/config/inputs.py).
    capacity: the capacity layer's state (`CapacityState(capacity_inputs(cfg))`; None: no capacity, tasks or power).
    forecasts: returns the forecaster's latest result (monitor/pipeline/forecaster.py); read once per
    cycle, so the cycle's /metrics, /api/v1/snapshot and landing page show the same forecast.
    """

    def __init__(self, settings: PipelineSettings, clock: Callable[[], float] = time.time,
                 capacity: Optional[CapacityState] = None,
                 forecasts: Optional[Callable[[], Optional[RefitResult]]] = None,
                 steady: Optional[Callable[[], float]] = None):
        self.settings = settings
        self.clock = clock
        # the step check compares `clock` with `steady`: on by default with the real wall clock; a test
        # driving its own clock passes the steady clock it drives too (or has no check)
        self.steady = steady if steady is not None else (steady_clock if clock is time.time else None)
        self.clock_steps: dict[str, float] = {"back": 0.0, "forward": 0.0}
        self._tick: Optional[tuple[float, float]] = None  # (wall, steady) when the previous cycle began
        self._clock_listeners: list[Callable[[float, float], None]] = []
        self.finished_at: Optional[float] = None  # time.monotonic() when the last cycle published
        self.state = CycleState(settings.step, capacity)
        self.forecasts = forecasts
        self.skipped_cycles = 0
        self.latest: Optional[Snapshot] = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self.scraper: Optional[Scraper] = None
        self.prom: Optional[PrometheusSourceReader] = None
        # every source's bodies in flight share one memory budget (global.scrape_memory_mib)
        self.budget = BodyBudget(settings.scrape_memory_mib * 1024 * 1024)
        step = settings.step
        if settings.vllm_targets:
            self.scraper = Scraper(Fetcher(settings.vllm_auth, self.budget),
                                   settings.scrape_timeout, settings.scrape_concurrency)
        if settings.prometheus:
            self.prom = PrometheusSourceReader(settings.prometheus, budget=self.budget, forget_after=step.forget_after,
                                               pool_by=list(normalise(step.pool_by)), latency_window=step.latency_window,
                                               total_kinds=settings.slo_signals, shard=step.shard,
                                               max_series=step.max_series, total_bounds=settings.slo_seconds,
                                               total_pools=settings.slo_pools)
        # gateways, DCGM, alerts (monitor/sources/auxiliary.py); gateway bodies are read for the capacity layer only
        gateway_configs: Optional[list[GatewayConfig]] = None
        if capacity is not None:
            gateway_configs = [capacity.gateway_config(gw.kind, gw.task_label, gw.session_label)
                               for gw in settings.gateways]
        self.aux = AuxSources(gateways=settings.gateways, dcgm_targets=settings.dcgm_targets, alerts=settings.alerts,
                              scrape_timeout=settings.scrape_timeout, interval=settings.interval, pool_by=step.pool_by,
                              budget=self.budget, gateway_configs=gateway_configs)
        self._sources: Optional[DeadlinePool] = None
        # Prometheus mode: time -> the SLO burn windows from Prometheus (monitor/history/slo_history.py); the
        # cycle passes None: at the query layer's own time, never headroom's clock (which may have stepped)
        self.slo_windows: Optional[Callable[[Optional[float]], dict]] = None
        if capacity is not None and self.prom is not None and settings.prometheus is not None:  # (prom: from it)
            self.slo_windows = prometheus_windows(
                self.prom.client, capacity.slo, [(gw.kind, gw.task_label) for gw in settings.gateways],
                interval=settings.interval, timeout=settings.prometheus.timeout, pool_by=step.pool_by).read
        self._slo_windows_failing = False

    # the state between cycles, as the pipeline's callers read it
    history = property(lambda self: self.state.history)
    errors = property(lambda self: self.state.errors)
    dropped = property(lambda self: self.state.dropped)
    anomalies = property(lambda self: self.state.anomalies)
    cycles = property(lambda self: self.state.cycles)
    last_success = property(lambda self: self.state.last_success)
    last_fresh = property(lambda self: self.state.last_fresh)

    def on_snapshot(self, listener: Callable[[Snapshot], None], first: bool = False) -> None:
        """`listener(snapshot)` after each cycle, in the order added; `first`: before every other (the
        web server renders /metrics before the store is written: the store is never on the live path)."""
        if first:
            self._listeners.insert(0, listener)
        else:
            self._listeners.append(listener)

    def on_clock_step(self, listener: Callable[[float, float], None]) -> None:
        """`listener(seconds, now)` after a wall-clock step of `seconds` (negative: back) is found."""
        self._clock_listeners.append(listener)

    def cycle_age(self) -> Optional[float]:
        """Seconds since the last cycle published (monotonic; None before the first)."""
        return None if self.finished_at is None else max(0.0, time.monotonic() - self.finished_at)

    def _check_clock(self, now: float) -> None:
        """Find a wall-clock step since the previous cycle; move the state onto the new clock."""
        if self.steady is None:
            return
        tick = (now, self.steady())
        previous, self._tick = self._tick, tick
        if previous is None:
            return
        jump = (tick[0] - previous[0]) - (tick[1] - previous[1])
        if abs(jump) <= CLOCK_STEP_TOLERANCE:
            return
        direction = "back" if jump < 0 else "forward"
        self.clock_steps[direction] += 1
        log.warning("the wall clock stepped %s by %.1f s since the previous cycle; the cycle state is moved onto "
                    "the new clock (headroom_clock_steps_total counts steps)", direction, abs(jump))
        self.state.shift_time(jump)
        self.aux.pace.shift_time(jump)
        if self.prom is not None:
            self.prom.shift_time(jump)
        for listener in self._clock_listeners:
            try:
                listener(jump, now)
            except Exception:
                log.exception("clock-step listener failed")

    # --- the cycle ---------------------------------------------------------------------------
    def run_cycle(self, wait_seconds: Optional[float] = None) -> Optional[Snapshot]:
        """One cycle; `wait_seconds` replaces the cycle deadline (default: cycle_deadline_seconds)."""
        if not self._lock.acquire(blocking=False):
            self.skipped_cycles += 1
            log.warning("previous cycle still running; this one is skipped")
            return None
        try:
            return self._cycle(wait_seconds)
        finally:
            self._lock.release()

    def _cycle(self, wait_seconds: Optional[float] = None) -> Snapshot:
        started = time.monotonic()
        now = self.clock()
        self._check_clock(now)
        deadline = None if wait_seconds is None else started + wait_seconds
        snapshot = self.advance(self.collect(now, deadline), now)
        snapshot.cycle_duration_seconds = time.monotonic() - started
        snapshot.clock_steps = dict(self.clock_steps)
        if self.prom is not None:
            snapshot.query_clock_steps = dict(self.prom.clock.steps)
        self.publish(snapshot)
        self.finished_at = time.monotonic()
        return snapshot

    def advance(self, inputs: CycleInputs, now: float) -> Snapshot:
        """`step` from the pipeline's state; the new state is kept."""
        self.state, snapshot = step(self.state, inputs, now)
        return snapshot

    def build(self, readings: Iterable[ReplicaReading], statuses: Iterable[SourceStatus], now: float) -> Snapshot:
        """`advance` on replica readings collected elsewhere (benchmarks): no other input."""
        return self.advance(CycleInputs(list(readings), list(statuses)), now)

    def collect(self, now: float, deadline: Optional[float] = None) -> CycleInputs:
        """Every source at once, parsed; one without an answer by `deadline` (monotonic; default:
        now + `cycle_deadline_seconds`) is down with reason `deadline` and its request is abandoned."""
        began = time.monotonic()
        if deadline is None:
            deadline = began + cycle_deadline_seconds(self.settings)
        pool = self._source_pool()
        prom = pool.start([("prometheus", partial(self.prom.read_all, now, deadline))]) if self.prom else []
        slo = pool.start([("slo-windows", partial(self.slo_windows, None))]) if self.slo_windows else []
        aux = self.aux.start(pool)
        inputs = CycleInputs([], [])
        if self.scraper is not None:
            targets = list(self.settings.vllm_targets)
            started = self.scraper.start(targets, clock=self.clock)
            for result in self.scraper.finish(targets, started, deadline, began):
                inputs.readings.extend(result.readings)
                inputs.statuses.append(result.status)
                count_into(inputs.anomalies, result.anomalies or {})
        for result in pool.wait(prom, deadline):
            if isinstance(result, PrometheusRead):
                inputs.readings.extend(result.readings)
                inputs.statuses.extend(result.statuses)
                count_into(inputs.anomalies, result.anomalies)
                inputs.pool_histograms, inputs.pool_totals = result.pool_histograms, result.pool_totals
                inputs.pool_totals_at = result.totals_at
                inputs.stale_seconds = dict(result.stale_seconds)
            else:
                assert self.prom is not None and self.settings.prometheus is not None  # asked only when configured
                inputs.statuses.append(_late("prometheus", self.settings.prometheus.url, result, began))
                late = PrometheusRead([], [])
                self.prom.stale_read(now, late)
                inputs.pool_histograms, inputs.pool_totals = late.pool_histograms, late.pool_totals
                inputs.pool_totals_at = late.totals_at
                inputs.stale_seconds = dict(late.stale_seconds)
        self.aux.collect(inputs, now, pool.wait(aux, deadline), began, self.state.history)
        if slo:
            inputs.slo_windows = self.slo_windows_result(pool.wait(slo, deadline)[0])
        inputs.forecast = self.forecasts() if self.forecasts is not None else None
        valid_inputs(inputs)
        return inputs

    def slo_windows_result(self, result: object) -> Optional[dict]:
        """The SLO windows Prometheus gave, or None (the tracker's are used): a failure is logged when
        it starts and when it is over, not every cycle."""
        if isinstance(result, dict):
            if self._slo_windows_failing:
                log.info("SLO windows from Prometheus are back")
            self._slo_windows_failing = False
            return result
        if not self._slo_windows_failing:
            why = result.detail(0.0) if isinstance(result, Late) else getattr(result, "reason", type(result).__name__)
            log.warning("SLO windows from Prometheus failed (the tracker's are used until it answers): %s", why)
        self._slo_windows_failing = True
        return None

    def _source_pool(self) -> DeadlinePool:
        """Workers for Prometheus, gateways and DCGM (vLLM targets have the scraper's own)."""
        if self._sources is None:
            self._sources = DeadlinePool(2 + self.aux.workers(), "sources")
        return self._sources

    def publish(self, snapshot: Snapshot) -> None:
        self.latest = snapshot  # a single reference swap: readers never see half a snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("snapshot listener failed")

    def close(self, wait: float = 0.0) -> None:
        """Stop every source at once: requests in flight break, a cycle waiting on them goes on with
        what it has. `wait`: seconds to let a running cycle finish publishing."""
        if self.scraper is not None:
            self.scraper.close()
        if self.prom is not None:
            self.prom.close()
        if self._sources is not None:
            self._sources.close()
        self.aux.close()
        if wait > 0 and self._lock.acquire(timeout=wait):
            self._lock.release()

