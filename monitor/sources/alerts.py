"""Firing alerts, read from a Prometheus (`/api/v1/alerts`) or an Alertmanager (`/api/v2/alerts`).

The landing page shows them beside the numbers they are about (`sources.alerts` in the config; the
demo points it at its own Prometheus). Pure given the response body: `read_alerts(text, kind)`.
Only `headroom`'s own alerts (names starting `Headroom`) are kept, firing ones first; pending
ones (Prometheus: the `for:` has not elapsed yet) are kept too, marked as such.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Optional

from ..model import Alert

KINDS = ("prometheus", "alertmanager")
API_PATH = {"prometheus": "/api/v1/alerts", "alertmanager": "/api/v2/alerts"}
UI_PATH = {"prometheus": "/alerts", "alertmanager": "/#/alerts"}
MAX_ALERTS = 200  # a flood of alerts is cut (counted in the snapshot's alerts_dropped)


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


def _alert(labels: object, annotations: object, state: str, since: object) -> Optional[Alert]:
    if not isinstance(labels, dict):
        return None
    name = labels.get("alertname")
    if not isinstance(name, str) or not name.startswith("Headroom"):
        return None
    ann = annotations if isinstance(annotations, dict) else {}
    return Alert(name=name, state=state, severity=str(labels.get("severity", "")),
                 pool=labels.get("pool") if isinstance(labels.get("pool"), str) else None,
                 summary=str(ann.get("summary", "")), since=_when(since),
                 labels={str(k): str(v) for k, v in labels.items()})


def read_alerts(text: str, kind: str) -> tuple[list[Alert], int]:
    """(headroom's alerts, firing first then by name and pool; how many were cut past MAX_ALERTS).

    Raises ValueError naming what is wrong with a body that is not such an answer."""
    if kind not in KINDS:
        raise ValueError(f"unknown alerts source kind {kind!r} (known: {', '.join(KINDS)})")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"alerts answer is not JSON: {exc}") from None
    out: list[Alert] = []
    if kind == "prometheus":
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise ValueError("alerts answer is not a Prometheus API success (status != success)")
        items = (doc.get("data") or {}).get("alerts") if isinstance(doc.get("data"), dict) else None
        if not isinstance(items, list):
            raise ValueError("alerts answer has no data.alerts list")
        for a in items:
            if isinstance(a, dict) and a.get("state") in ("firing", "pending"):
                alert = _alert(a.get("labels"), a.get("annotations"), a["state"], a.get("activeAt"))
                if alert is not None:
                    out.append(alert)
    else:
        if not isinstance(doc, list):
            raise ValueError("alerts answer is not an Alertmanager v2 alert list")
        for a in doc:
            status = a.get("status") if isinstance(a, dict) else None
            if isinstance(status, dict) and status.get("state") == "active":
                alert = _alert(a.get("labels"), a.get("annotations"), "firing", a.get("startsAt"))
                if alert is not None:
                    out.append(alert)
    out.sort(key=lambda x: (x.state != "firing", x.name, x.pool or ""))
    return out[:MAX_ALERTS], max(0, len(out) - MAX_ALERTS)
