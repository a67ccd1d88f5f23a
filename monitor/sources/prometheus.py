"""Prometheus mode: read the fleet through any Prometheus-compatible query API.

Works against Prometheus 2.x, VictoriaMetrics, Thanos Query and Mimir (the /api/v1 query endpoints).
Each cycle asks the query layer for what it needs at the granularity it needs
(monitor/sources/prometheus_queries.py): the per-replica gauges, counters and histogram sums and
counts are regrouped per `instance` into the same parsed form a direct scrape gives and turned into
`ReplicaReading`s by the same code; the latency histograms are summed per pool by the query layer
over the latency window. Both modes give the same active, queued, KV and rates on the same fleet,
and quantiles within one bucket.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urlencode, urlsplit

from monitor.kit.exposition import ParsedScrape, normalise_name
from monitor.kit.http import Backoff, BodyBudget, Fetcher, FetchError, redact
from monitor.kit.redact import scrub

from . import sglang, vllm
from .settings import PrometheusSource

log = logging.getLogger(__name__)



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
                 sleep: Optional[Callable[[float], Any]] = None,
                 headers: Optional[Callable[[], dict[str, str]]] = None,
                 make_fetcher: Optional[Callable[[int], Fetcher]] = None):
        self.url = url.rstrip("/")
        self.headers = headers  # the extra headers (tenant), resolved on every request; never logged
        self.timeout = timeout
        self.retries = max(0, retries)
        self.fetcher = fetcher or Fetcher()
        # answers held to a smaller cap than the fetcher's (`max_bytes`): one fetcher per cap, made on demand
        self._make_fetcher = make_fetcher or (lambda cap: Fetcher(max_body=cap))
        self._capped: dict[int, Fetcher] = {}
        self._capped_lock = threading.Lock()
        self.backoff = backoff or Backoff()
        self._closed = threading.Event()
        self.sleep = sleep or self._closed.wait  # a backoff wait ends at once on close()

    @classmethod
    def from_config(cls, src: PrometheusSource, budget: Optional[BodyBudget] = None) -> "PrometheusClient":
        return cls(src.url, src.timeout, src.retries, Fetcher(src.auth, budget),
                   headers=src.header_values if src.headers else None,
                   make_fetcher=lambda cap: Fetcher(src.auth, budget, cap))

    def _fetcher(self, max_bytes: Optional[int]) -> Fetcher:
        """The fetcher holding an answer to `max_bytes` (rounded up to a power of two, at least 1 MiB),
        or the client's own when None or not smaller than its cap."""
        own = getattr(self.fetcher, "max_body", None)
        if max_bytes is None or own is None or max_bytes >= own:
            return self.fetcher
        cap = max(1 << 20, 1 << (max(1, max_bytes) - 1).bit_length())
        if cap >= own:
            return self.fetcher
        with self._capped_lock:
            if cap not in self._capped:
                self._capped[cap] = self._make_fetcher(cap)
                if self._closed.is_set():
                    self._capped[cap].close()
            return self._capped[cap]

    def _call(self, path: str, params: dict[str, Any], deadline: Optional[float] = None,
              max_bytes: Optional[int] = None) -> Any:
        last = PrometheusError("deadline", "no attempt fitted before the deadline")
        body = urlencode(params).encode()
        try:
            headers = {**self.headers(), **_POST_HEADERS} if self.headers is not None else _POST_HEADERS
        except Exception as exc:  # noqa: BLE001 (a header's file or variable is gone: its name, never a value)
            raise PrometheusError("config", f"a header value could not be read: {exc}") from None
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
                status, data = self._fetcher(max_bytes).request("POST", self.url + path, timeout, body, headers)
            except FetchError as exc:
                if exc.reason not in ("timeout", "connect", "truncated"):
                    raise PrometheusError(exc.reason, self.scrub(exc.detail)) from None
                last = PrometheusError(exc.reason, self.scrub(exc.detail))
                continue
            if status >= 500 or status == 429:
                last = PrometheusError("http", f"HTTP {status} from {redact(self.url)}{path}")
                continue
            if 300 <= status < 400:
                raise PrometheusError("http", f"HTTP {status} from {redact(self.url)}{path}: redirects are not "
                                              "followed (give the final URL)")
            try:
                return _data(data, status)
            except PrometheusError as exc:  # its detail quotes the answer: capped, the secrets masked
                raise PrometheusError(exc.reason, self.scrub(exc.detail)) from None
        raise last

    def secrets(self) -> list[str]:
        """What must never be shown of the requests: the credentials (a bearer token, a Basic header's
        password), the URL's password and the extra headers' values (tenants)."""
        out = []
        auth = self.fetcher.headers.get("Authorization", "")
        scheme, _, value = auth.partition(" ")
        if value:
            out.append(value)
            if scheme == "Basic":
                try:
                    out.append(base64.b64decode(value).decode("utf-8", "replace").partition(":")[2])
                except ValueError:
                    pass
        try:
            out.append(urlsplit(self.url).password or "")
            if self.headers is not None:
                out.extend(self.headers().values())
        except Exception:  # noqa: BLE001 - a header's file gone: the other secrets are still masked
            pass
        return [s for s in out if s]

    def scrub(self, text: object) -> str:
        """Upstream text fit for a log line, the snapshot and the landing page (monitor/kit/redact.py):
        at most 512 characters, the secrets of `secrets()` masked wherever they appear."""
        return scrub(text, self.secrets())

    def query(self, query: str, at: Optional[float] = None, deadline: Optional[float] = None,
              warnings: Optional[list] = None, stamps: Optional[list] = None,
              max_bytes: Optional[int] = None) -> list[tuple[dict[str, str], float]]:
        """An instant vector at `at`, or at the query layer's own now when None (no `time` sent). The
        answer's `warnings` (a partial response: a store or shard did not answer) are appended to
        `warnings` when given, so the caller can say the answer is partial; with `stamps`, the time the
        query layer evaluated it at (its samples' timestamp) is appended when the vector is not empty.
        `max_bytes`: a smaller cap on this answer (FetchError too_large past it, before it is parsed)."""
        params = {"query": query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params, deadline, max_bytes)
        if warnings is not None:
            warnings.extend(self.scrub(w) for w in (data.get("_warnings") or ())[:10])
        vector = decode_vector(data)
        if stamps is not None and vector:
            stamps.append(_value(data["result"][0].get("value"))[0])
        return vector

    def query_range(self, query: str, start: float, end: float, step: float, deadline: Optional[float] = None
                    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        data = self._call("/api/v1/query_range", {"query": query, "start": f"{start:.3f}",
                                                  "end": f"{end:.3f}", "step": f"{step:g}"}, deadline)
        return decode_matrix(data)

    def close(self) -> None:
        """Ends a backoff wait and any request in flight, from any thread."""
        self._closed.set()
        self.fetcher.close()
        with self._capped_lock:
            for fetcher in self._capped.values():
                fetcher.close()


# PromQL's own notes on a query (Prometheus 2.45+: "PromQL info: metric might not be a counter..."),
# carried in `warnings` by some versions: about the data, not a part of it missing
PROMQL_NOTES = ("PromQL info:", "PromQL warning:")


def partial_warnings(warnings: list[str]) -> list[str]:
    """The warnings that say an answer is partial (a store, shard or tenant did not answer; Thanos,
    Mimir, VictoriaMetrics' isPartial), not PromQL's own notes on the data."""
    return [w for w in warnings if not w.startswith(PROMQL_NOTES)]


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
    if body.get("isPartial") is True:  # VictoriaMetrics cluster: a vmstorage node did not answer
        data["_warnings"] = [*data.get("_warnings", ()), "the query layer marked its answer partial (isPartial)"]
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
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError("parse", "data.result is not a list")
    out: list[tuple[dict[str, str], float]] = []
    append = out.append
    for item in result:  # the checks of _metric and _value at C speed (a fleet's answer has ~30,000 items)
        try:
            m, pair = item["metric"], item["value"]
            "".join(m.values())  # every label value a string (JSON keys always are); else TypeError
            if type(m) is not dict or len(pair) != 2:
                raise TypeError
            float(pair[0])
            append((m, float(pair[1])))
        except (TypeError, KeyError, ValueError, AttributeError):
            append((_metric(item), _value(item.get("value") if isinstance(item, dict) else None)[1]))
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


def scrapes_from_vector(samples: list[tuple[dict[str, str], float]], instance_label: str = "instance",
                        keep: Optional[Sequence[str]] = None, consume: bool = False) -> dict:
    """Regroup an instant-query vector of raw engine series into one ParsedScrape per instance. A
    histogram's `_count` also stands for its `+Inf` bucket when the read has no buckets (Prometheus
    mode reads the buckets per pool), so the reading keeps the histogram's sum and count.
    With `keep` (labels such as pool_by's), the value is (scrape, {label: value}) of the instance's
    first series carrying each label. `consume`: the label dicts are taken over (their `__name__`
    removed), not copied - 30,000 copies a cycle are a tenth of Prometheus mode's CPU."""
    by_instance: dict[str, ParsedScrape] = {}
    kept: dict[str, dict[str, str]] = {}
    names: dict[str, str] = {}  # the name as stored -> as the readers know it (a fleet has a few dozen)
    labels_kept = tuple(keep or ())
    for labels, value in samples:
        name = labels.get("__name__")
        if not name:
            continue
        instance = labels.get(instance_label, "")
        scrape = by_instance.get(instance)
        if scrape is None:
            scrape = by_instance[instance] = ParsedScrape()
            kept[instance] = {}
        clean = labels if consume else labels.copy()  # a C-level copy, then the name out
        del clean["__name__"]
        if labels_kept:
            mine = kept[instance]
            for label in labels_kept:
                if label in clean and label not in mine:
                    mine[label] = clean[label]
        known = names.get(name)
        if known is None:
            known = names[name] = normalise_name("sglang:" + name[len("sglang_"):] if name.startswith("sglang_")
                                                 else name)
        got = scrape.samples.get(known)
        if got is None:
            scrape.samples[known] = [(clean, value)]
        else:
            got.append((clean, value))
    counts = {n for n in names.values() if n.endswith("_count")}
    for scrape in by_instance.values():
        for name in counts:
            bucket = name[:-len("_count")] + "_bucket"
            if name in scrape.samples and bucket not in scrape.samples:
                scrape.samples[bucket] = [({**lb, "le": "+Inf"}, v) for lb, v in scrape.samples[name]]
    if keep is not None:
        return {inst: (scrape, kept[inst]) for inst, scrape in by_instance.items()}
    return by_instance


def engine_of_scrape(scrape: ParsedScrape):
    """The reader of an instance's series (sglang.looks_like_sglang decides)."""
    return sglang if sglang.looks_like_sglang(scrape) else vllm
