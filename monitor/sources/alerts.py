"""Firing alerts, read from a Prometheus (`/api/v1/alerts`) or an Alertmanager (`/api/v2/alerts`).

The landing page shows them beside the numbers they are about (`sources.alerts` in the config; the
demo points it at its own Prometheus). Pure given the response body: `read_alerts(text, kind)`.
Only `headroom`'s own alerts (names starting `Headroom`) are kept, firing ones first; pending
ones (Prometheus: the `for:` has not elapsed yet) are kept too, marked as such. With
`sources.alerts.match` (this daemon's target labels, e.g. `{job: headroom}`) another job's alerts for
the same pools are left out (`this_jobs`): a direct-mode and a Prometheus-mode daemon, both watched
by one Prometheus, each list their own.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Optional

from ..model import Alert

KINDS = ("prometheus", "alertmanager")
API_PATH = {"prometheus": "/api/v1/alerts", "alertmanager": "/api/v2/alerts"}
UI_PATH = {"prometheus": "/alerts", "alertmanager": "/#/alerts"}
# A flood is cut, so a hostile or broken source cannot inflate the landing page or the JSON: each
# text (the summary, each label value, all labels together) to MAX_TEXT characters, the list to
# MAX_ALERTS alerts and MAX_PAGE_TEXT characters of text in all. What was cut is counted (the cycle
# adds it to headroom_input_anomalies_total{kind="alerts_cut"}; the page and the JSON show it).
MAX_ALERTS = 200
# alerts of the answer's list looked at (anyone's: headroom's are picked from them), like the rows of a
# gateway body (monitor/sources/aux_samples.py AUX_MAX_ROWS, counted as aux_rows_cut past it): 90,000
# small alerts took 3.5 s to read; a fleet's own alerts are a few hundred
MAX_ITEMS = 5_000
MAX_TEXT = 1024
MAX_PAGE_TEXT = 64 * 1024
CUT_MARK = " …[cut]"


def api_url(base: str, kind: str) -> str:
    return base.rstrip("/") + API_PATH[kind]


def ui_url(base: str, kind: str) -> str:
    return base.rstrip("/") + UI_PATH[kind]


def _when(value: object) -> Optional[float]:
    """An RFC 3339 time (Prometheus `activeAt`, Alertmanager `startsAt`) in epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    text = value.replace("Z", "+00:00")
    if "." in text:  # Go writes up to nanoseconds; Python reads microseconds
        head, _, rest = text.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        text = head + "." + digits[:6] + rest[len(digits):]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class _Cuts:
    """Texts cut while reading one answer."""

    def __init__(self) -> None:
        self.texts = 0

    def text(self, value: object, limit: int = MAX_TEXT) -> str:
        out = value if isinstance(value, str) else str(value)
        if len(out) <= limit:
            return out
        self.texts += 1
        return out[:max(0, limit - len(CUT_MARK))] + CUT_MARK

    def labels(self, labels: dict) -> dict:
        """Each value cut to MAX_TEXT; the labels past MAX_TEXT characters in all left out."""
        out, size = {}, 0
        for k, v in labels.items():
            key, value = self.text(k, 128), self.text(v)
            size += len(key) + len(value)
            if size > MAX_TEXT:
                self.texts += 1
                break
            out[key] = value
        return out


def _size(alert: Alert) -> int:
    return len(alert.name) + len(alert.summary) + sum(len(k) + len(v) for k, v in alert.labels.items())


def _alert(labels: object, annotations: object, state: str, since: object, cuts: _Cuts) -> Optional[Alert]:
    if not isinstance(labels, dict):
        return None
    name = labels.get("alertname")
    if not isinstance(name, str) or not name.startswith("Headroom"):
        return None
    ann = annotations if isinstance(annotations, dict) else {}
    pool = labels.get("pool")
    return Alert(name=cuts.text(name, 256), state=state, severity=cuts.text(labels.get("severity", ""), 64),
                 pool=cuts.text(pool) if isinstance(pool, str) else None,
                 summary=cuts.text(ann.get("summary", "")), since=_when(since), labels=cuts.labels(labels))


def _items(doc: object, kind: str, rows_cut: Optional[list] = None, match: Optional[dict] = None
           ) -> list[tuple[object, object, str, object]]:
    """The answer's alerts, each as (labels, annotations, state, since), before headroom's are picked:
    another job's left out first (`match`: `this_jobs`), then the first MAX_ITEMS of the rest
    (`rows_cut` gets True appended when there were more), so another job's alerts never take this
    daemon's places under the caps."""
    def first(items: list) -> list:
        if match:
            items = [a for a in items if not isinstance(a, dict) or not isinstance(a.get("labels"), dict)
                     or all(a["labels"].get(k, v) == v for k, v in match.items())]
        if len(items) > MAX_ITEMS and rows_cut is not None:
            rows_cut.append(True)
        return items[:MAX_ITEMS]
    if kind == "prometheus":
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise ValueError("alerts answer is not a Prometheus API success (status != success)")
        items = (doc.get("data") or {}).get("alerts") if isinstance(doc.get("data"), dict) else None
        if not isinstance(items, list):
            raise ValueError("alerts answer has no data.alerts list")
        return [(a.get("labels"), a.get("annotations"), a["state"], a.get("activeAt")) for a in first(items)
                if isinstance(a, dict) and a.get("state") in ("firing", "pending")]
    if not isinstance(doc, list):
        raise ValueError("alerts answer is not an Alertmanager v2 alert list")
    return [(a.get("labels"), a.get("annotations"), "firing", a.get("startsAt")) for a in first(doc)
            if isinstance(a, dict) and isinstance(a.get("status"), dict) and a["status"].get("state") == "active"]


def _read(text: str, kind: str, rows_cut: Optional[list] = None, match: Optional[dict] = None
          ) -> tuple[list[Alert], int]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"alerts answer is not JSON: {exc}") from None
    cuts, out, shortened = _Cuts(), [], set()
    for item in _items(doc, kind, rows_cut, match):
        before = cuts.texts
        alert = _alert(*item, cuts)
        if alert is not None:
            out.append(alert)
            if cuts.texts > before:
                shortened.add(id(alert))
    out.sort(key=lambda x: (x.state != "firing", x.name, x.pool or ""))
    kept, size = [], 0
    for alert in out[:MAX_ALERTS]:
        size += _size(alert)
        if size > MAX_PAGE_TEXT:
            break
        kept.append(alert)
    return kept, len(out) - len(kept) + sum(id(a) in shortened for a in kept)


def this_jobs(alerts: list[Alert], match: dict[str, str]) -> list[Alert]:
    """The alerts that are not another job's: none of `match`'s labels set to another value (an
    alert without the label, as the vLLM rules' are, is kept)."""
    return [a for a in alerts if all(a.labels.get(k, v) == v for k, v in match.items())]


def read_alerts(text: str, kind: str, rows_cut: Optional[list] = None, match: Optional[dict] = None
                ) -> tuple[list[Alert], int]:
    """(headroom's alerts, firing first then by name and pool; how many were cut: the alerts left
    out past MAX_ALERTS or MAX_PAGE_TEXT, plus those kept with a text cut to MAX_TEXT). Another job's
    alerts (`match`, sources.alerts.match: `this_jobs`) are left out before any cap; only the first
    MAX_ITEMS alerts of the rest are looked at (`rows_cut`, a list, gets True when more).

    Raises ValueError naming what is wrong with a body that is not such an answer, whatever the failure
    (a nesting too deep for the parser, a value of an unexpected type)."""
    if kind not in KINDS:
        raise ValueError(f"unknown alerts source kind {kind!r} (known: {', '.join(KINDS)})")
    try:
        return _read(text, kind, rows_cut, match)
    except ValueError:
        raise
    except RecursionError:
        raise ValueError("alerts answer is nested too deeply to read") from None
    except Exception as exc:  # noqa: BLE001 - any other surprise in a hostile answer is a parse failure, not a stop
        raise ValueError(f"alerts answer could not be read: {type(exc).__name__}: {exc}"[:300]) from None
