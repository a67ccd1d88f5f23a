"""The cycle's auxiliary sources: gateways (and application task counters), DCGM exporters, alerts.

    aux = AuxSources(gateways=..., dcgm_targets=..., alerts=..., scrape_timeout=..., interval=...,
                     pool_by=..., budget=budget, gateway_configs=...)   # one per Pipeline (monitor/pipeline/cycle.py)
    started = aux.start(pool)                        # every body requested at once, on the cycle's pool
    aux.collect(inputs, now, pool.wait(started, deadline), began, history)   # parsed into CycleInputs

Each body is fetched with the source's own credentials under the shared memory budget and the
auxiliary body cap (AUX_MAX_BODY_BYTES), and parsed by the worker that fetched it, at most
AUX_MAX_ROWS rows of it (a body cut there is counted as the input anomaly `aux_rows_cut`), so the
cycle's deadline covers the parse. A source without an answer by the cycle deadline is down
(`deadline`); one whose answer does not parse is down with reason `parse` and the reader's error;
either way the cycle goes on. Gateway bodies are read for the capacity layer only (`gateway_configs`
None: fetched, their status counted, not read), also per model of the cycle's pools when a gateway
with a model label and no `pool` fronts several; each `GatewayScrape` carries the gateway's
`labels` (its scope: monitor/derive/gateway_scope.py). A gateway is read once per cycle at its own
pace (its timeout, a late answer read the next cycle, its last reading kept through a missed cycle:
slow, not down): monitor/sources/gateway_pace.py.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence, Union

from monitor.derive.core import pool_of
from monitor.kit.http import BodyBudget, Fetcher, FetchError, redact
from monitor.model import ReplicaReading, SourceStatus
from monitor.model.readings import DcgmReading, GatewayConfig, GatewayScrape
from monitor.sources.alerts import api_url, read_alerts, ui_url
from monitor.sources.aux_samples import AUX_MAX_BODY_BYTES, AUX_MAX_ROWS
from monitor.sources.dcgm import read_dcgm
from monitor.sources.deadline_pool import DeadlinePool, Late
from monitor.sources.gateway import gateway_samples, scrape_from_samples
from monitor.sources.gateway_pace import MISSED, SLOW_MISSES, GatewayPace, gateway_timeout
from monitor.sources.gateway_queue import KINDS as QUEUE_KINDS
from monitor.sources.gateway_queue import queue_samples, queues_from_samples
from monitor.step.cycle_state import CycleInputs, count_into

log = logging.getLogger(__name__)


class AuxSources:
    """The configured gateways (sources.gateways), DCGM exporters (sources.dcgm.targets) and alerts source
    (sources.alerts, or None); `scrape_timeout` and `interval` (global.*) give each request's timeout,
    `pool_by` (global.pool_by) the pools a gateway's per-model readings are read for."""

    def __init__(self, *, gateways: Sequence[Any], dcgm_targets: Sequence[Any], alerts: Optional[Any],
                 scrape_timeout: float, interval: float, pool_by: Any, budget: BodyBudget,
                 gateway_configs: Optional[list[GatewayConfig]] = None):
        self.gateways, self.dcgm_targets, self.alerts = list(gateways), list(dcgm_targets), alerts
        self.scrape_timeout, self.interval, self.pool_by = scrape_timeout, interval, pool_by
        self.budget = budget
        self.gateway_configs = gateway_configs
        self._fetchers: dict[int, Fetcher] = {}
        self._cut_said: set = set()  # (kind, url) of sources whose body was cut at the row cap (said once)
        self.pace = GatewayPace()
        self._started: list = []

    def workers(self) -> int:
        """How many requests a cycle starts at most."""
        return len(self.gateways) + len(self.dcgm_targets) + 1

    def _fetcher_for(self, auth) -> Fetcher:
        key = id(auth)
        f = self._fetchers.get(key)
        if f is None:
            f = self._fetchers[key] = Fetcher(auth, self.budget, max_body=AUX_MAX_BODY_BYTES)
        return f

    def start(self, pool: DeadlinePool) -> list:
        """Every auxiliary body requested on `pool` and parsed there, by the worker that fetched it, so
        the cycle's deadline covers the parse too; the handles for `pool.wait`. A gateway whose request
        of an earlier cycle has finished since is not asked again: that answer is read."""
        timeout = self.scrape_timeout
        for fetcher in self._fetchers.values():  # kept connections the sources closed since the last cycle
            fetcher.prune()
        self.pace.carried.clear()
        carried = {i: self.pace.carry(i) for i in range(len(self.gateways))}
        jobs: list[tuple[Hashable, Callable[[], Any]]] = [
            (("gateway", i, gw.url), partial(fetch, self._fetcher_for(gw.auth), gw.url,
                                             gateway_timeout(gw, self.scrape_timeout, self.interval),
                                             partial(self.prepare_gateway, i)))
            for i, gw in enumerate(self.gateways) if carried[i] is None]
        if self.dcgm_targets:
            dcgm = self._fetcher_for(None)
            jobs += [(("dcgm", t.url),
                      partial(fetch, dcgm, t.url, timeout, partial(_prepare_dcgm, target=redact(t.url))))
                     for t in self.dcgm_targets]
        alerts = self.alerts
        if alerts is not None:
            url = api_url(alerts.url, alerts.kind)
            jobs.append((("alerts", url), partial(fetch, self._fetcher_for(alerts.auth), url, timeout,
                                                  partial(_prepare_alerts, kind=alerts.kind, match=alerts.match))))
        started = iter(pool.start(jobs))
        out = [(("gateway", i, gw.url), carried[i]) if carried[i] is not None else next(started)
               for i, gw in enumerate(self.gateways)]
        self._started = out + list(started)
        return self._started

    def prepare_gateway(self, index: int, text: str) -> "Parsed":
        """A gateway body parsed (on the worker that fetched it): the samples its reading needs and, for
        a router, its queues; each at most AUX_MAX_ROWS rows. A failure is kept, for `collect` to say."""
        src = self.gateways[index]
        if self.gateway_configs is None:  # fetched for its status only
            return Parsed(None)
        cut = False
        try:
            samples: Any = gateway_samples(text, self.gateway_configs[index])
            cut = samples.cut
        except ValueError as exc:
            samples = str(exc)
        queues: Any = None
        if src.kind in QUEUE_KINDS:
            try:
                rows = queue_samples(text, src.kind)
                queues, cut = queues_from_samples(rows, src.kind), cut or rows.cut
            except ValueError as exc:
                queues = exc
        return Parsed((samples, queues), cut)

    def collect(self, inputs: CycleInputs, now: float, results: Sequence[object], began: float,
                history: Optional[Mapping[str, Sequence[ReplicaReading]]] = None) -> None:
        """The answers (`results`, in `start`'s order) parsed into `inputs`; `history` is the
        replicas the pipeline keeps (their pools count for the gateways' per-model readings)."""
        sources: list[tuple[str, str, Optional[int]]] = [("gateway", gw.url, i) for i, gw in enumerate(self.gateways)]
        sources += [("dcgm", t.url, None) for t in self.dcgm_targets]
        if self.alerts is not None:
            sources.append(("alerts", api_url(self.alerts.url, self.alerts.kind), None))
            inputs.alerts_ui = redact(ui_url(self.alerts.url, self.alerts.kind))
        models = pool_models(inputs.readings, history or {}, self.pool_by) if self.gateways else ()
        for j, ((kind, url, index), result) in enumerate(zip(sources, results)):
            if kind == "gateway":
                assert index is not None  # a gateway's row carries its index
                future = self._started[j][1] if j < len(self._started) else None
                self._paced_gateway(inputs, index, url, result, future, now, began, models)
                continue
            if isinstance(result, tuple):
                parsed, err, took = result
                inputs.statuses.append(SourceStatus(kind, redact(url), err is None, err.reason if err else None,
                                                    err.detail if err else None, took))
            else:
                parsed = None
                inputs.statuses.append(late(kind, url, result, began))
            if isinstance(parsed, Parsed) and parsed.cut:
                count_into(inputs.anomalies, {"aux_rows_cut": 1.0})
                self._say_cut(kind, url)
            if kind == "alerts":
                if parsed is not None:
                    self._alerts_read(inputs, parsed.value, url)
            elif parsed is not None:
                reading = parsed.value
                if isinstance(reading, DcgmReading):
                    inputs.dcgm.append(reading)
                elif reading is not None:
                    inputs.statuses[-1] = unparsed(inputs.statuses[-1], reading)

    def _paced_gateway(self, inputs: CycleInputs, index: int, url: str, result: object, future: object,
                       now: float, began: float, models: tuple) -> None:
        """A gateway's answer, or a slow gateway's kept reading, or down (gateway_pace.py)."""
        if isinstance(result, Late):
            self.pace.still_running(index, future, now)
        text, err, took = result if isinstance(result, tuple) else (None, None, time.monotonic() - began)
        if isinstance(result, tuple) and err is None:
            if isinstance(text, Parsed) and text.cut:
                count_into(inputs.anomalies, {"aux_rows_cut": 1.0})
                self._say_cut("gateway", url)
            stamp, late_answer = self.pace.stamp(index, now, took)
            slow = late_answer or took > self.scrape_timeout
            detail = None
            if slow:
                detail = (f"slow: answered in {took:.1f} s" + (", after the cycle deadline (read this cycle)"
                                                               if late_answer else f", over scrape_timeout "
                                                               f"{self.scrape_timeout:g} s"))
            inputs.statuses.append(SourceStatus("gateway", redact(url), True, None, detail, took, slow=slow))
            self._gateway(inputs, index, text, stamp, models)
            if inputs.statuses[-1].up:
                self.pace.answered(index, inputs.gateways[-1])
            else:
                self.pace.failed(index)
            return
        self.pace.carried.pop(index, None)
        down = (SourceStatus("gateway", redact(url), False, err.reason, err.detail, took) if err is not None
                else late("gateway", url, result, began))
        kept = self.pace.missed(index) if down.error in MISSED else None
        if kept is None:
            if down.error not in MISSED:
                self.pace.failed(index)
            inputs.statuses.append(down)
            self._gateway(inputs, index, None, now, models)
            return
        why = down.detail or down.error
        inputs.statuses.append(SourceStatus(
            "gateway", redact(url), True, None, f"slow: {why}; its reading of {now - kept.timestamp:.0f} s ago is kept "
            f"(missed {self.pace.misses[index]} of at most {SLOW_MISSES} cycles in a row)", took, slow=True))
        inputs.gateways.append(replace(kept, kept=True))

    def _say_cut(self, kind: str, url: str) -> None:
        """A body cut at the row cap: said once per source (the anomaly counts every cycle)."""
        if (kind, url) not in self._cut_said:
            self._cut_said.add((kind, url))
            log.warning("%s %s: more than %d rows; the rest of its body is not read (headroom_input_anomalies_total"
                        "{kind=\"aux_rows_cut\"} counts the cycles it happens)", kind, redact(url), AUX_MAX_ROWS)

    def _gateway(self, inputs: CycleInputs, index: int, parsed: Optional["Parsed"], now: float, models: tuple) -> None:
        src = self.gateways[index]
        try:
            inputs.gateways.append(self.read_gateway(index, parsed, now, models))
        except Exception as exc:  # noqa: BLE001 (never the cycle's: the gateway is down, its reason parse)
            inputs.statuses[-1] = unparsed(inputs.statuses[-1], exc)
            log.warning("gateway %s: %s", redact(src.url), inputs.statuses[-1].detail)
            inputs.gateways.append(GatewayScrape(index, redact(src.url), src.pool, GatewayConfig(kind=src.kind), now,
                                                 error="parse", labels=dict(src.labels)))

    def read_gateway(self, index: int, body: Union[str, "Parsed", None], now: float, models: tuple[str, ...] = ()
                     ) -> GatewayScrape:
        """The body (text, or parsed already by `prepare_gateway`) read, also per model of `models` for a
        gateway with a model label and no `pool`; without a capacity layer it is fetched (its status
        counts), not read."""
        src = self.gateways[index]
        if self.gateway_configs is None:
            return GatewayScrape(index, redact(src.url), src.pool, GatewayConfig(kind=src.kind), now,
                                 labels=dict(src.labels))
        if isinstance(body, str):
            body = self.prepare_gateway(index, body)
        samples, queues = body.value if body is not None else (None, None)
        gcfg = self.gateway_configs[index]
        per_model = models if (src.pool is None and gcfg.model) else ()
        scrape = scrape_from_samples(samples, gcfg, now, index, redact(src.url), src.pool, per_model)
        scrape = replace(scrape, labels=dict(src.labels))
        if scrape.error:
            log.warning("gateway %s: %s", scrape.url, scrape.error)
        if isinstance(queues, ValueError):
            log.warning("gateway %s: queue: %s", scrape.url, queues)
        elif queues is not None:
            scrape = replace(scrape, queues=queues)
        return scrape

    def _read_alerts(self, inputs: CycleInputs, text: str, url: str) -> None:
        """The alerts answer `text` read into `inputs` (as the worker does, `_prepare_alerts`)."""
        assert self.alerts is not None  # read only from a configured alerts source
        self._alerts_read(inputs, _prepare_alerts(text, self.alerts.kind, self.alerts.match).value, url)

    def _alerts_read(self, inputs: CycleInputs, result: Any, url: str) -> None:
        if isinstance(result, BaseException):  # whatever the answer did to the reader: this source's error
            inputs.statuses[-1] = unparsed(inputs.statuses[-1], result)
            log.warning("alerts %s: %s", redact(url), inputs.statuses[-1].detail)
            return
        inputs.alerts, dropped = result
        if dropped:
            count_into(inputs.anomalies, {"alerts_cut": float(dropped)})

    def close(self) -> None:
        for f in list(self._fetchers.values()):
            f.close()


def pool_models(readings: Sequence[ReplicaReading], history: Mapping[str, Sequence[ReplicaReading]],
                pool_by: Any) -> tuple[str, ...]:
    """The models of this cycle's pools: of its replica readings and of the replicas the state
    keeps (one that did not answer still makes its pool); () for one pool (it takes it all)."""
    newest = list(readings) + [dq[-1] for dq in history.values() if dq]
    if len({pool_of(r, pool_by) for r in newest}) < 2:
        return ()
    return tuple(sorted({r.model for r in newest}))


@dataclass(frozen=True)
class Parsed:
    """An auxiliary body parsed by the worker that fetched it: what its reader made of it (`value`),
    and whether rows past AUX_MAX_ROWS were left unread (`cut`)."""
    value: Any
    cut: bool = False


def _prepare_dcgm(text: str, target: str) -> Parsed:
    """The DCGM reading; None for a body without GPUs (a ValueError, logged); any other failure of
    the reader is returned, for the cycle to mark the source down with it."""
    cut: list = []
    try:
        return Parsed(read_dcgm(text, target, cut), bool(cut))
    except ValueError as exc:
        log.warning("%s", exc)
        return Parsed(None, bool(cut))
    except Exception as exc:  # noqa: BLE001 (returned: the cycle marks the source down with it)
        log.warning("dcgm %s: %s: %s", target, type(exc).__name__, str(exc)[:200])
        return Parsed(exc, bool(cut))


def _prepare_alerts(text: str, kind: str, match: Optional[dict] = None) -> Parsed:
    """(headroom's alerts, how many cut) of an alerts answer, this daemon's job's only (`match`), or
    the exception reading it raised."""
    cut: list = []
    try:
        return Parsed(read_alerts(text, kind, cut, match), bool(cut))
    except Exception as exc:  # noqa: BLE001 (returned: the cycle marks the source down with it)
        return Parsed(exc, bool(cut))


def unparsed(status: SourceStatus, exc: BaseException) -> SourceStatus:
    """A source whose answer could not be read: down, reason `parse`, the error named (cut short)."""
    detail = f"{type(exc).__name__}: {str(exc)[:200]}" if not isinstance(exc, ValueError) else str(exc)[:300]
    return replace(status, up=False, error="parse", detail=detail)


def fetch(fetcher: Fetcher, url: str, timeout: float, parse: Optional[Callable[[str], Any]] = None
          ) -> tuple[Any, Optional[FetchError], float]:
    """(the body, or what `parse` made of it; the fetch error; seconds the fetch took)."""
    t0 = time.monotonic()
    try:
        text = fetcher.get(url, timeout)
    except FetchError as exc:
        return None, exc, time.monotonic() - t0
    took = time.monotonic() - t0
    return (text if parse is None else parse(text)), None, took


def late(source: str, url: str, result: object, began: float) -> SourceStatus:
    """The status of a source without an answer at the cycle deadline (or whose reader failed)."""
    waited = time.monotonic() - began
    if isinstance(result, Late):
        return SourceStatus(source, redact(url), False, "deadline", result.detail(waited), waited,
                            attempted=result.state not in ("busy", "closed"))
    log.error("%s reader failed", source, exc_info=result if isinstance(result, BaseException) else None)
    return SourceStatus(source, redact(url), False, "internal", type(result).__name__, waited)


__all__ = ["AuxSources", "fetch", "late", "pool_models", "unparsed"]
