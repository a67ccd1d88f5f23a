"""Prometheus mode: read the fleet through any Prometheus-compatible query API.

Works against Prometheus 2.x, VictoriaMetrics, Thanos Query and Mimir (the /api/v1 query endpoints).
The raw vLLM series are read with one instant query, regrouped per `instance` into the same parsed
form a direct scrape gives, and turned into `ReplicaReading`s by the same code, so both modes give
the same numbers on the same fleet.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import urlencode

from .settings import PrometheusSource
from ..model import ReplicaReading, SourceStatus
from . import sglang, vllm
from .exposition import ParsedScrape, normalise_name
from .http import Backoff, BodyBudget, FetchError, Fetcher, redact

log = logging.getLogger(__name__)

FORGET_AFTER = 3600.0  # global.forget_after's default, for a reader built without it


class PrometheusError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class PrometheusClient:
    """/api/v1 queries with retries. Each request ends within `timeout`; a call given a `deadline`
    (monotonic seconds) makes no attempt and sleeps no backoff past it."""

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3,
                 fetcher: Optional[Fetcher] = None, backoff: Optional[Backoff] = None,
                 sleep: Optional[Callable[[float], Any]] = None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, retries)
        self.fetcher = fetcher or Fetcher()
        self.backoff = backoff or Backoff()
        self._closed = threading.Event()
        self.sleep = sleep or self._closed.wait  # a backoff wait ends at once on close()

    @classmethod
    def from_config(cls, src: PrometheusSource, budget: Optional[BodyBudget] = None) -> "PrometheusClient":
        return cls(src.url, src.timeout, src.retries, Fetcher(src.auth, budget))

    def _call(self, path: str, params: dict[str, Any], deadline: Optional[float] = None) -> Any:
        last = PrometheusError("deadline", "no attempt fitted before the deadline")
        body = urlencode(params).encode()
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff.delay(attempt - 1)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    break
                self.sleep(delay)
            if self._closed.is_set():
                last = PrometheusError("closed", "the client is shut down")
                break
            timeout = self.timeout if deadline is None else min(self.timeout, deadline - time.monotonic())
            if timeout <= 0:
                break
            try:
                status, data = self.fetcher.request("POST", self.url + path, timeout, body, _POST_HEADERS)
            except FetchError as exc:
                if exc.reason not in ("timeout", "connect", "truncated"):
                    raise PrometheusError(exc.reason, exc.detail) from None
                last = PrometheusError(exc.reason, exc.detail)
                continue
            if status >= 500 or status == 429:
                last = PrometheusError("http", f"HTTP {status} from {redact(self.url)}{path}")
                continue
            if 300 <= status < 400:
                raise PrometheusError("http", f"HTTP {status} from {redact(self.url)}{path}: redirects are not "
                                              "followed (give the final URL)")
            return _data(data, status)
        raise last

    def query(self, query: str, at: Optional[float] = None, deadline: Optional[float] = None,
              warnings: Optional[list] = None) -> list[tuple[dict[str, str], float]]:
        """An instant vector; the answer's `warnings` (a partial response: a store or shard did not
        answer) are appended to `warnings` when given, so the caller can say the answer is partial."""
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params, deadline)
        if warnings is not None:
            warnings.extend(str(w) for w in data.get("_warnings") or ())
        return decode_vector(data)

    def query_range(self, query: str, start: float, end: float, step: float, deadline: Optional[float] = None
                    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        data = self._call("/api/v1/query_range", {"query": query, "start": f"{start:.3f}",
                                                  "end": f"{end:.3f}", "step": f"{step:g}"}, deadline)
        return decode_matrix(data)

    def close(self) -> None:
        """Ends a backoff wait and any request in flight, from any thread."""
        self._closed.set()
        self.fetcher.close()


_POST_HEADERS = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}


def _data(raw: bytes, status: int) -> Any:
    try:
        body = json.loads(raw)
    except ValueError:
        raise PrometheusError("parse", f"response is not JSON (HTTP {status})") from None
    except RecursionError:
        raise PrometheusError("parse", f"response JSON is nested too deep (HTTP {status})") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error") if isinstance(body, dict) else None
        raise PrometheusError("query", f"HTTP {status}: {err or 'status is not success'}")
    data = body.get("data")
    if not isinstance(data, dict) or "result" not in data:
        raise PrometheusError("parse", "response has no data.result")
    warnings = body.get("warnings")
    if warnings:
        data["_warnings"] = warnings if isinstance(warnings, list) else [warnings]
    return data


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
    """Every vLLM and SGLang series headroom reads (either spelling of the prefix)."""
    regex = "|".join(f"{prefix}[:_](" + "|".join(sorted({n[n.index(':') + 1:] for n in names})) + ")"
                     for prefix, names in (("(ray_)?vllm", vllm.WANTED), ("sglang", sglang.WANTED)))
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
        if name.startswith("sglang_"):
            name = "sglang:" + name[len("sglang_"):]
        scrape.samples.setdefault(normalise_name(name), []).append((clean, value))
    return by_instance


def engine_of_scrape(scrape: ParsedScrape):
    """The reader of an instance's series (sglang.looks_like_sglang decides)."""
    return sglang if sglang.looks_like_sglang(scrape) else vllm


class PrometheusSourceReader:
    """Reads ReplicaReadings for the whole fleet with two instant queries per cycle."""

    def __init__(self, src: PrometheusSource, client: Optional[PrometheusClient] = None,
                 budget: Optional[BodyBudget] = None, forget_after: float = FORGET_AFTER):
        self.src = src
        self.client = client or PrometheusClient.from_config(src, budget)
        self.known: dict[str, float] = {}  # instance that served vLLM series -> the last time it did
        self.forget_after = forget_after  # an instance silent this long is forgotten (global.forget_after)

    def read(self, now: Optional[float] = None, deadline: Optional[float] = None
             ) -> tuple[list[ReplicaReading], list[SourceStatus], dict[str, int]]:
        """Readings, statuses and input anomalies by kind; no request runs past `deadline`
        (monotonic seconds), if given. A partial answer (Prometheus `warnings`) is used and counted
        as the anomaly `partial_response`, its first warning logged."""
        now = time.time() if now is None else now
        name = redact(self.src.url)
        start = time.monotonic()
        warnings: list[str] = []
        anomalies: dict[str, int] = {}
        try:
            vector = self.client.query(vllm_selector(self.src.selector), at=now, deadline=deadline,
                                       warnings=warnings)
        except PrometheusError as exc:
            return [], [SourceStatus("prometheus", name, False, exc.reason, exc.detail, time.monotonic() - start)], {}
        if warnings:
            anomalies["partial_response"] = 1
            log.warning("Prometheus answered with %d warning(s) (a partial response): %s", len(warnings),
                        warnings[0][:200])
        statuses = [SourceStatus("prometheus", name, True, duration_seconds=time.monotonic() - start)]
        readings: list[ReplicaReading] = []
        missing: dict[str, tuple[str, ...]] = {}  # instance -> contract families it has no series of
        for instance, scrape in sorted(scrapes_from_vector(vector, self.src.instance_label).items()):
            engine = engine_of_scrape(scrape)
            readings.extend(engine.readings_from_scrape(scrape, instance, now))
            missing[instance] = engine.missing_families(scrape)
            for kind, n in scrape.anomalies.items():
                anomalies[kind] = anomalies.get(kind, 0) + n
        # targets Prometheus itself sees as down
        try:
            ups = self.client.query(_up_selector(self.src.selector), at=now, deadline=deadline)
            seen = {r.target for r in readings}
            self._remember(seen, now)
            for labels, value in ups:
                inst = labels.get(self.src.instance_label, "")
                if not self.src.selector and inst not in self.known:
                    continue  # without a selector, `up` covers every job: report only vLLM ones
                if value == 0 or math.isnan(value):
                    statuses.append(SourceStatus("vllm", inst, False, "down_in_prometheus", "up == 0"))
                elif inst in seen:
                    statuses.append(SourceStatus("vllm", inst, True, missing=missing.get(inst, ())))
        except PrometheusError as exc:
            log.warning("could not read up series from Prometheus: %s", exc.reason)
        return readings, statuses, anomalies

    def _remember(self, seen: set[str], now: float) -> None:
        """Note the instances seen now; forget those silent for `forget_after` (replica churn)."""
        for inst in seen:
            self.known[inst] = now
        for inst in [i for i, t in self.known.items() if now - t > self.forget_after]:
            del self.known[inst]

    def shift_time(self, seconds: float) -> None:
        """The wall clock stepped by `seconds` (monitor/cycle.py): the last-seen times move with it."""
        self.known = {inst: t + seconds for inst, t in self.known.items()}

    def close(self) -> None:
        self.client.close()


def _up_selector(extra: str) -> str:
    matchers = ['__name__="up"']
    if extra.strip():
        matchers.append(extra.strip().strip("{}"))
    return "{" + ",".join(matchers) + "}"
