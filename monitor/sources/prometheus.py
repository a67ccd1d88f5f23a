"""Prometheus mode: read the fleet through any Prometheus-compatible query API.

Works against Prometheus 2.x, VictoriaMetrics, Thanos Query and Mimir (the /api/v1 query endpoints).
The raw vLLM series are read with one instant query, regrouped per `instance` into the same parsed
form a direct scrape gives, and turned into `ReplicaReading`s by the same code, so both modes give
the same numbers on the same fleet.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Optional

import requests

from ..config import PrometheusSource
from ..model import ReplicaReading, SourceStatus
from .exposition import ParsedScrape, normalise_name
from .http import Backoff, make_session, redact
from .vllm import WANTED, readings_from_scrape

log = logging.getLogger(__name__)


class PrometheusError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class PrometheusClient:
    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3,
                 session: Optional[requests.Session] = None, backoff: Optional[Backoff] = None,
                 sleep=time.sleep):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, retries)
        self.session = session or make_session()
        self.backoff = backoff or Backoff()
        self.sleep = sleep

    @classmethod
    def from_config(cls, src: PrometheusSource) -> "PrometheusClient":
        return cls(src.url, src.timeout, src.retries, make_session(src.auth))

    def _call(self, path: str, params: dict[str, Any]) -> Any:
        last: Optional[PrometheusError] = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff.delay(attempt - 1))
            try:
                resp = self.session.post(self.url + path, data=params, timeout=self.timeout)
            except requests.exceptions.Timeout:
                last = PrometheusError("timeout", f"no answer within {self.timeout:g}s")
                continue
            except requests.exceptions.ConnectionError as exc:
                last = PrometheusError("connect", type(exc).__name__)
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                last = PrometheusError("http", f"HTTP {resp.status_code} from {redact(self.url)}{path}")
                continue
            try:
                body = resp.json()
            except ValueError:
                raise PrometheusError("parse", f"response is not JSON (HTTP {resp.status_code})") from None
            if not isinstance(body, dict) or body.get("status") != "success":
                err = body.get("error") if isinstance(body, dict) else None
                raise PrometheusError("query", f"HTTP {resp.status_code}: {err or 'status is not success'}")
            data = body.get("data")
            if not isinstance(data, dict) or "result" not in data:
                raise PrometheusError("parse", "response has no data.result")
            return data
        assert last is not None
        raise last

    def query(self, query: str, at: Optional[float] = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params)
        return decode_vector(data)

    def query_range(self, query: str, start: float, end: float, step: float
                    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        data = self._call("/api/v1/query_range", {"query": query, "start": f"{start:.3f}",
                                                  "end": f"{end:.3f}", "step": f"{step:g}"})
        return decode_matrix(data)


def _value(pair: Any) -> tuple[float, float]:
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise PrometheusError("parse", f"sample is not [time, value]: {str(pair)[:60]}")
    try:
        return float(pair[0]), float(pair[1])  # float() accepts "NaN", "+Inf", "-Inf"
    except (TypeError, ValueError):
        raise PrometheusError("parse", f"bad sample value {str(pair)[:60]}") from None


def _metric(item: Any) -> dict[str, str]:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
        raise PrometheusError("parse", "result item has no metric labels")
    m = item["metric"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise PrometheusError("parse", "metric labels must be strings")
    return m


def decode_vector(data: dict) -> list[tuple[dict[str, str], float]]:
    if data.get("resultType") not in ("vector", None):
        raise PrometheusError("parse", f"expected a vector, got {data.get('resultType')}")
    out = []
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError("parse", "data.result is not a list")
    for item in result:
        out.append((_metric(item), _value(item.get("value"))[1]))
    return out


def decode_matrix(data: dict) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    if data.get("resultType") not in ("matrix", None):
        raise PrometheusError("parse", f"expected a matrix, got {data.get('resultType')}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError("parse", "data.result is not a list")
    out = []
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(values, list):
            raise PrometheusError("parse", "matrix item has no values list")
        out.append((_metric(item), [_value(v) for v in values]))
    return out


def vllm_selector(extra: str = "") -> str:
    bases = sorted({n[len("vllm:"):] for n in WANTED})
    regex = "vllm[:_](" + "|".join(bases) + ")"
    matchers = [f'__name__=~"{regex}"']
    if extra.strip():
        matchers.append(extra.strip().strip("{}"))
    return "{" + ",".join(matchers) + "}"


def scrapes_from_vector(samples: list[tuple[dict[str, str], float]], instance_label: str = "instance"
                        ) -> dict[str, ParsedScrape]:
    """Regroup an instant-query vector of raw vLLM series into one ParsedScrape per instance."""
    by_instance: dict[str, ParsedScrape] = {}
    for labels, value in samples:
        name = labels.get("__name__")
        if not name:
            continue
        instance = labels.get(instance_label, "")
        scrape = by_instance.setdefault(instance, ParsedScrape())
        clean = {k: v for k, v in labels.items() if k != "__name__"}
        scrape.samples.setdefault(normalise_name(name), []).append((clean, value))
    return by_instance


class PrometheusSourceReader:
    """Reads ReplicaReadings for the whole fleet with two instant queries per cycle."""

    def __init__(self, src: PrometheusSource, client: Optional[PrometheusClient] = None):
        self.src = src
        self.client = client or PrometheusClient.from_config(src)
        self.known: set[str] = set()  # instances that served vLLM series before

    def read(self, now: Optional[float] = None) -> tuple[list[ReplicaReading], list[SourceStatus]]:
        now = time.time() if now is None else now
        name = redact(self.src.url)
        start = time.monotonic()
        try:
            vector = self.client.query(vllm_selector(self.src.selector), at=now)
        except PrometheusError as exc:
            return [], [SourceStatus("prometheus", name, False, exc.reason, exc.detail, time.monotonic() - start)]
        statuses = [SourceStatus("prometheus", name, True, duration_seconds=time.monotonic() - start)]
        readings: list[ReplicaReading] = []
        for instance, scrape in sorted(scrapes_from_vector(vector, self.src.instance_label).items()):
            for r in readings_from_scrape(scrape, instance, now):
                # keep target labels other than the metric's own (e.g. job) for pool_by
                readings.append(r)
        # targets Prometheus itself sees as down
        try:
            ups = self.client.query(_up_selector(self.src.selector), at=now)
            seen = {r.target for r in readings}
            self.known |= seen
            for labels, value in ups:
                inst = labels.get(self.src.instance_label, "")
                if not self.src.selector and inst not in self.known:
                    continue  # without a selector, `up` covers every job: report only vLLM ones
                if value == 0 or math.isnan(value):
                    statuses.append(SourceStatus("vllm", inst, False, "down_in_prometheus", "up == 0"))
                elif inst in seen:
                    statuses.append(SourceStatus("vllm", inst, True))
        except PrometheusError as exc:
            log.warning("could not read up series from Prometheus: %s", exc.reason)
        return readings, statuses


def _up_selector(extra: str) -> str:
    matchers = ['__name__="up"']
    if extra.strip():
        matchers.append(extra.strip().strip("{}"))
    return "{" + ",".join(matchers) + "}"
