"""Rendering a digest into the payload files, and the three destinations that deliver them.

Payload files (stored once per ISO week in the outbox, so every retry sends the same bytes):
    digest.md, digest.html (charts as data: URIs), digest.json, slack.json, summary.txt,
    email.html (charts as cid: references), <chart id>.png
A sender returns only after its destination acknowledged: the directory after the files were
written and renamed into place (fsync'd), the webhook on HTTP 2xx, SMTP when the server answered 250
to the end of DATA (smtplib raises otherwise). Errors raised here never carry a secret.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import smtplib
import socket
import ssl as ssl_mod
import tempfile
import threading
import time
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any, Callable
from urllib.parse import urlsplit

from monitor.digest.charts import charts_for
from monitor.digest.outbox import DeliveryError
from monitor.digest.render import render_html, render_json, render_markdown, render_slack, summary_text
from monitor.digest.settings import DirectoryDestination, SmtpDestination, WebhookDestination

log = logging.getLogger(__name__)


def render_files(digest: dict) -> dict[str, bytes]:
    charts = charts_for(digest)
    names = {cid: f"{cid}.png" for cid in charts}
    files = {f"{cid}.png": png for cid, png in charts.items()}
    files["digest.md"] = render_markdown(digest, names).encode()
    files["digest.html"] = render_html(digest, charts).encode()
    files["email.html"] = render_html(digest, charts, lambda cid, png: f"cid:{cid}@headroom").encode()
    files["digest.json"] = render_json(digest).encode()
    files["slack.json"] = json.dumps(render_slack(digest)).encode()
    files["summary.txt"] = summary_text(digest).encode()
    files["meta.json"] = json.dumps({"title": digest["title"], "iso_week": digest["iso_week"],
                                     "edition": digest.get("edition", digest["iso_week"]),
                                     "charts": sorted(charts)}).encode()
    return files


DIGEST_FILES = ("digest.md", "digest.html", "digest.json")


def free_dir(path: str, files: dict[str, bytes]) -> str:
    """Where to write a digest without losing one written before: `path` when it holds no digest, or
    this same digest (a retried write); else the first of `path-2`, `path-3`, ... that holds none
    or this one. A rerun in the same week never rewrites the first digest: it is versioned."""
    def ours(d: str) -> bool:
        old = [n for n in DIGEST_FILES if os.path.exists(os.path.join(d, n))]
        if not old:
            return True
        for n in old:
            with open(os.path.join(d, n), "rb") as f:
                if n not in files or f.read() != files[n]:
                    return False
        return True
    n, candidate = 1, path
    while not ours(candidate):
        n += 1
        candidate = f"{path.rstrip(os.sep)}-{n}"
    return candidate


def write_dir(path: str, files: dict[str, bytes], formats=("md", "html", "json")) -> list[str]:
    """Write the chosen formats into `path` (each file via a temporary file, fsync and rename)."""
    os.makedirs(path, exist_ok=True)
    wanted = []
    for name in files:
        if name.endswith(".png") and "md" in formats:
            wanted.append(name)
    wanted += [f"digest.{f}" for f in formats if f"digest.{f}" in files]
    for name in wanted:
        fd, tmp = tempfile.mkstemp(dir=path, prefix=".tmp-")
        try:
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(files[name])
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(path, name))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return wanted


def directory_sender(dest: DirectoryDestination) -> Callable:
    def send(key: str, week: str, payload: dict) -> None:
        assert dest.path is not None  # a required key: the reader refuses a directory without one
        try:
            write_dir(free_dir(os.path.join(dest.path, week), payload), payload, dest.formats)
        except OSError as exc:
            raise DeliveryError(f"directory {dest.path}: {exc.strerror or type(exc).__name__}") from None
    return send


def webhook_sender(dest: WebhookDestination) -> Callable:
    """POST slack.json through the sources' HTTP client (monitor/kit/http.py): one total
    deadline of `dest.timeout` covers connect, TLS, the request and the answer, so a webhook that
    answers slowly cannot outlive the outbox lease. Plain http.client underneath on purpose:
    requests/urllib3 log the request line (with the webhook's secret path) at DEBUG, and their
    exception messages quote the URL; a FetchError carries neither."""
    from monitor.kit.http import Fetcher, FetchError  # noqa: PLC0415

    def send(key: str, week: str, payload: dict) -> None:
        try:
            url = dest.webhook_url()
            token = dest.secret("bearer_token")
        except (OSError, ValueError) as exc:
            raise DeliveryError(f"webhook {dest.name}: cannot read its secret: "
                                f"{getattr(exc, 'strerror', None) or exc}") from None
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise DeliveryError(f"webhook {dest.name}: the configured URL is not http(s)")
        headers = {"Content-Type": "application/json", "Accept": "*/*", "Idempotency-Key": key,
                   "User-Agent": "headroom-digest"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        fetcher = Fetcher()
        try:
            status, _ = fetcher.request("POST", url, dest.timeout, payload["slack.json"], headers)
        except FetchError as exc:  # reason and detail name no host, path or secret
            raise DeliveryError(f"webhook {dest.name}: {exc.reason} ({exc.detail})") from None
        finally:
            fetcher.close()
        if not 200 <= status < 300:
            raise DeliveryError(f"webhook {dest.name}: HTTP {status}")
    return send


def build_email(dest: SmtpDestination, key: str, payload: dict) -> EmailMessage:
    meta = json.loads(payload["meta.json"])
    msg = EmailMessage()
    msg["Subject"] = f"{dest.subject_prefix} {meta['title']}: {meta.get('edition', meta['iso_week'])}".strip()
    msg["From"] = dest.sender
    msg["To"] = ", ".join(dest.to)
    msg["Date"] = formatdate(localtime=False)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    msg["Message-ID"] = f"<{digest}@headroom.digest>"  # the same on every attempt (make_msgid adds time and randomness)
    msg["X-Headroom-Idempotency-Key"] = key
    msg.set_content(payload["summary.txt"].decode() + "\n\n" + payload["digest.md"].decode())
    msg.add_alternative(payload["email.html"].decode(), subtype="html")
    html_part = list(msg.iter_parts())[1]  # the alternative just added
    for cid in meta["charts"]:
        html_part.add_related(payload[f"{cid}.png"], maintype="image", subtype="png",
                              cid=f"<{cid}@headroom>", filename=f"{cid}.png")
    return msg


def smtp_sender(dest: SmtpDestination) -> Callable:
    def send(key: str, week: str, payload: dict) -> None:
        assert dest.host is not None  # a required key: the reader refuses an smtp destination without one
        msg = build_email(dest, key, payload)
        try:
            password = dest.secret("password")
        except (OSError, ValueError) as exc:
            raise DeliveryError(f"smtp {dest.name}: cannot read the password: "
                                f"{getattr(exc, 'strerror', None) or exc}") from None
        ctx = ssl_mod.create_default_context(cafile=dest.ca_file)
        # smtplib's timeout bounds each socket operation; the timer bounds the whole conversation:
        # at `dest.timeout` it shuts the socket, and the operation in progress fails at once
        held: list = []
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            _shut(held)
        timer = threading.Timer(dest.timeout, expire)
        timer.daemon = True
        began = time.monotonic()
        timer.start()
        try:
            # made unconnected, then connected: the timer can end a greeting that never comes
            client = (smtplib.SMTP_SSL(timeout=dest.timeout, context=ctx) if dest.ssl
                      else smtplib.SMTP(timeout=dest.timeout))
            held.append(client)
            client._host = dest.host  # type: ignore[attr-defined]  # what STARTTLS and SMTP_SSL verify; smtplib sets it only in __init__
            client.connect(dest.host, dest.port)
            with client:
                client.ehlo()
                if dest.starttls:
                    client.starttls(context=ctx)
                    client.ehlo()
                if dest.username:
                    client.login(dest.username, password or "")
                refused = client.send_message(msg)  # raises unless the server said 250 after DATA
            if refused:
                raise DeliveryError(f"smtp {dest.name}: {len(refused)} recipient(s) refused")
        except smtplib.SMTPResponseException as exc:  # server code only; never the AUTH exchange
            raise DeliveryError(f"smtp {dest.name}: server answered {exc.smtp_code}") from None
        except smtplib.SMTPRecipientsRefused as exc:
            raise DeliveryError(f"smtp {dest.name}: all {len(exc.recipients)} recipient(s) refused") from None
        except (smtplib.SMTPException, OSError) as exc:
            # the timer's shutdown, or smtplib's own per-read timeout reaching the same deadline first
            # (a busy machine runs the timer's thread late): either way the deadline ended it
            if fired.is_set() or time.monotonic() - began >= dest.timeout:
                raise DeliveryError(f"smtp {dest.name}: no acknowledgement within {dest.timeout:g}s") from None
            raise DeliveryError(f"smtp {dest.name}: {type(exc).__name__}") from None
        finally:
            timer.cancel()
    return send


def _shut(held: list) -> None:
    """End an SMTP conversation from the timer's thread (its socket, not its state)."""
    for client in held:
        sock = getattr(client, "sock", None)
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


def senders_for(destinations) -> dict[str, Callable]:
    # by `type`, which names the destination's class (monitor/digest/settings.py _DESTINATIONS)
    makers: dict[str, Callable[[Any], Callable]] = {"directory": directory_sender, "webhook": webhook_sender,
                                                    "smtp": smtp_sender}
    out = {}
    for d in destinations:
        out[d.name] = makers[d.type](d)
    return out
