"""The cycle's auxiliary sources: gateways (and application task counters), DCGM exporters, alerts.

    aux = AuxSources(cfg, budget, gateway_configs)   # one per Pipeline (monitor/cycle.py)
    started = aux.start(pool)                        # every body requested at once, on the cycle's pool
    aux.collect(inputs, now, pool.wait(started, deadline), began, history)   # parsed into CycleInputs

Each body is fetched with the source's own credentials under the shared memory budget and the
auxiliary body cap (AUX_MAX_BODY_BYTES). A source without an answer by the cycle deadline is down
(`deadline`); one whose answer does not parse is down with reason `parse` and the reader's error;
either way the cycle goes on. Gateway bodies are read for the capacity layer only (`gateway_configs`
None: fetched, their status counted, not read), also per model of the cycle's pools when a gateway
with a model label and no `pool` fronts several; each `GatewayScrape` carries the gateway's
`labels` (its scope: monitor/derive/gateway_scope.py).
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

from monitor.derive.core import pool_of
from monitor.kit.http import BodyBudget, FetchError, Fetcher, redact
from monitor.model import ReplicaReading, SourceStatus
from monitor.readings import DcgmReading, GatewayConfig, GatewayScrape
from monitor.sources.alerts import api_url, read_alerts, ui_url
from monitor.sources.aux_samples import AUX_MAX_BODY_BYTES
from monitor.sources.dcgm import read_dcgm
from monitor.sources.gateway import read_gateway_scrape
from monitor.sources.gateway_queue import KINDS as QUEUE_KINDS, read_gateway_queues
from monitor.sources.scrape import DeadlinePool, Late
from monitor.step import CycleInputs, count_into

log = logging.getLogger(__name__)


class AuxSources:
    """The gateways, DCGM exporters and alerts source of `config` (the loaded configuration)."""

    def __init__(self, config: Any, budget: BodyBudget, gateway_configs: Optional[list[GatewayConfig]] = None):
        self.config = config
        self.budget = budget
        self.gateway_configs = gateway_configs
        self._fetchers: dict[int, Fetcher] = {}

    def workers(self) -> int:
        """How many requests a cycle starts at most."""
        return len(self.config.gateways) + len(self.config.dcgm_targets) + 1

    def _fetcher_for(self, auth) -> Fetcher:
        key = id(auth)
        f = self._fetchers.get(key)
        if f is None:
            f = self._fetchers[key] = Fetcher(auth, self.budget, max_body=AUX_MAX_BODY_BYTES)
        return f

    def start(self, pool: DeadlinePool) -> list:
        """Every auxiliary body requested on `pool`; the handles for `pool.wait`."""
        timeout = self.config.scrape_timeout
        for fetcher in self._fetchers.values():  # kept connections the sources closed since the last cycle
            fetcher.prune()
        jobs = [(("gateway", i, gw.url), lambda f=self._fetcher_for(gw.auth), u=gw.url: fetch(f, u, timeout))
                for i, gw in enumerate(self.config.gateways)]
        dcgm = self._fetcher_for(None) if self.config.dcgm_targets else None
        jobs += [(("dcgm", t.url), lambda u=t.url: fetch(dcgm, u, timeout)) for t in self.config.dcgm_targets]
        alerts = self.config.alerts
        if alerts is not None:
            url = api_url(alerts.url, alerts.kind)
            jobs.append((("alerts", url), lambda f=self._fetcher_for(alerts.auth), u=url: fetch(f, u, timeout)))
        return pool.start(jobs)

    def collect(self, inputs: CycleInputs, now: float, results: Sequence[object], began: float,
                history: Optional[Mapping[str, Sequence[ReplicaReading]]] = None) -> None:
        """The answers (`results`, in `start`'s order) parsed into `inputs`; `history` is the
        replicas the pipeline keeps (their pools count for the gateways' per-model readings)."""
        cfg = self.config
        sources = [("gateway", gw.url, i) for i, gw in enumerate(cfg.gateways)]
        sources += [("dcgm", t.url, None) for t in cfg.dcgm_targets]
        if cfg.alerts is not None:
            sources.append(("alerts", api_url(cfg.alerts.url, cfg.alerts.kind), None))
            inputs.alerts_ui = redact(ui_url(cfg.alerts.url, cfg.alerts.kind))
        models = pool_models(inputs.readings, history or {}, cfg.pool_by) if cfg.gateways else ()
        for (kind, url, index), result in zip(sources, results):
            if isinstance(result, tuple):
                text, err, took = result
                inputs.statuses.append(SourceStatus(kind, redact(url), err is None, err.reason if err else None,
                                                    err.detail if err else None, took))
            else:
                text = None
                inputs.statuses.append(late(kind, url, result, began))
            if kind == "gateway":
                self._gateway(inputs, index, text, now, models)
            elif kind == "alerts":
                if text is not None:
                    self._read_alerts(inputs, text, url)
            elif text is not None:
                reading = _read_dcgm(text, redact(url))
                if isinstance(reading, DcgmReading):
                    inputs.dcgm.append(reading)
                elif reading is not None:
                    inputs.statuses[-1] = unparsed(inputs.statuses[-1], reading)

    def _gateway(self, inputs: CycleInputs, index: int, text: Optional[str], now: float, models: tuple) -> None:
        src = self.config.gateways[index]
        try:
            inputs.gateways.append(self.read_gateway(index, text, now, models))
        except Exception as exc:  # never the cycle's: the gateway is down, its reason parse
            inputs.statuses[-1] = unparsed(inputs.statuses[-1], exc)
            log.warning("gateway %s: %s", redact(src.url), inputs.statuses[-1].detail)
            inputs.gateways.append(GatewayScrape(index, redact(src.url), src.pool, GatewayConfig(kind=src.kind), now,
                                                 error="parse", labels=dict(src.labels)))

    def read_gateway(self, index: int, text: Optional[str], now: float, models: tuple[str, ...] = ()
                     ) -> GatewayScrape:
        """The body parsed, also per model of `models` for a gateway with a model label and no `pool`;
        without a capacity layer it is fetched (its status counts), not read."""
        src = self.config.gateways[index]
        if self.gateway_configs is None:
            return GatewayScrape(index, redact(src.url), src.pool, GatewayConfig(kind=src.kind), now,
                                 labels=dict(src.labels))
        gcfg = self.gateway_configs[index]
        per_model = models if (src.pool is None and gcfg.model) else ()
        scrape = read_gateway_scrape(text, gcfg, now, index, redact(src.url), src.pool, per_model)
        scrape = replace(scrape, labels=dict(src.labels))
        if scrape.error:
            log.warning("gateway %s: %s", scrape.url, scrape.error)
        if text is not None and src.kind in QUEUE_KINDS:
            try:
                scrape = replace(scrape, queues=read_gateway_queues(text, src.kind))
            except ValueError as exc:
                log.warning("gateway %s: queue: %s", scrape.url, exc)
        return scrape

    def _read_alerts(self, inputs: CycleInputs, text: str, url: str) -> None:
        try:
            inputs.alerts, dropped = read_alerts(text, self.config.alerts.kind)
        except Exception as exc:  # whatever the answer does to the reader, it is this source's error
            inputs.statuses[-1] = unparsed(inputs.statuses[-1], exc)
            log.warning("alerts %s: %s", redact(url), inputs.statuses[-1].detail)
            return
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


def _read_dcgm(text: str, target: str):
    """The DCGM reading; None for a body without GPUs (a ValueError, logged); any other failure of
    the reader is returned, for the cycle to mark the source down with it."""
    try:
        return read_dcgm(text, target)
    except ValueError as exc:
        log.warning("%s", exc)
        return None
    except Exception as exc:
        log.warning("dcgm %s: %s: %s", target, type(exc).__name__, str(exc)[:200])
        return exc


def unparsed(status: SourceStatus, exc: BaseException) -> SourceStatus:
    """A source whose answer could not be read: down, reason `parse`, the error named (cut short)."""
    detail = f"{type(exc).__name__}: {str(exc)[:200]}" if not isinstance(exc, ValueError) else str(exc)[:300]
    return replace(status, up=False, error="parse", detail=detail)


def fetch(fetcher: Fetcher, url: str, timeout: float) -> tuple[Optional[str], Optional[FetchError], float]:
    t0 = time.monotonic()
    try:
        return fetcher.get(url, timeout), None, time.monotonic() - t0
    except FetchError as exc:
        return None, exc, time.monotonic() - t0


def late(source: str, url: str, result: object, began: float) -> SourceStatus:
    """The status of a source without an answer at the cycle deadline (or whose reader failed)."""
    waited = time.monotonic() - began
    if isinstance(result, Late):
        return SourceStatus(source, redact(url), False, "deadline", result.detail(waited), waited,
                            attempted=result.state not in ("busy", "closed"))
    log.error("%s reader failed", source, exc_info=result if isinstance(result, BaseException) else None)
    return SourceStatus(source, redact(url), False, "internal", type(result).__name__, waited)


__all__ = ["AuxSources", "fetch", "late", "pool_models", "unparsed"]
