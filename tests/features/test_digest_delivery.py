"""Digest delivery: a real webhook receiver, a real SMTP server, the SQLite outbox across failures and
a SIGKILLed process. No mocks: every server here is a socket server on 127.0.0.1, port 0."""
from __future__ import annotations

import base64
import email
import email.policy
import json
import os
import signal
import socketserver
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from servers import free_port, self_signed_cert

from headroom_lab.digest_demo import demo_input, demo_settings
from monitor.capacity.settings import PoolSettings
from monitor.digest.content import build_digest
from monitor.digest.deliver import render_files, senders_for
from monitor.digest.metrics import metric_samples
from monitor.digest.outbox import Outbox
from monitor.digest.schedule import open_outbox
from monitor.digest.settings import DigestSettings, from_dict

WEEK_END = 1764547200.0  # Mon 2025-12-01 00:00 UTC
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PY):
    PY = sys.executable


# ---- a webhook receiver -----------------------------------------------------------------------

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


class Receiver:
    """Slack-like webhook endpoint; answers `status` and records what it acknowledged."""

    def __init__(self, port: int = 0, status: int = 200, hold_first: bool = False):
        self.status = status
        self.received: list[dict] = []
        self.arrived = threading.Event()  # a request came in (acknowledged or not)
        self.release = threading.Event()
        self.hold_first = hold_first
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.arrived.set()
                if outer.hold_first:  # never answer the first request: it is not acknowledged
                    outer.hold_first = False
                    outer.release.wait(900)
                    return
                code = outer.status
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if 200 <= code < 300:
                    outer.received.append({"path": self.path, "headers": dict(self.headers),
                                           "body": json.loads(body), "at": time.time()})

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# ---- a small SMTP server (RFC 5321 subset: EHLO/HELO, AUTH PLAIN/LOGIN, MAIL, RCPT, DATA) -----

class SmtpServer:
    def __init__(self, username: str | None = None, password: str | None = None, fail_data: bool = False,
                 tls=None):
        self.messages: list[dict] = []
        self.auth_ok: list[str] = []
        outer = self

        class H(socketserver.StreamRequestHandler):
            def reply(self, line: str):
                self.wfile.write((line + "\r\n").encode())
                self.wfile.flush()

            def handle(self):
                self.reply("220 localhost test SMTP")
                mail_from, rcpts, authed = None, [], username is None
                secure = False
                while True:
                    raw = self.rfile.readline()
                    if not raw:
                        return
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    verb = line.split(" ", 1)[0].upper()
                    arg = line[len(verb):].strip()
                    if verb == "EHLO":
                        self.reply("250-localhost")
                        if tls is not None and not secure:
                            self.reply("250-STARTTLS")
                        self.reply("250-AUTH PLAIN LOGIN")
                        self.reply("250 8BITMIME")
                    elif verb == "HELO":
                        self.reply("250 localhost")
                    elif verb == "STARTTLS" and tls is not None:
                        self.reply("220 2.0.0 ready to start TLS")
                        self.connection = tls.wrap_socket(self.connection, server_side=True)
                        self.rfile = self.connection.makefile("rb")
                        self.wfile = self.connection.makefile("wb")
                        secure, authed = True, username is None
                    elif verb == "AUTH" and tls is not None and not secure:
                        self.reply("538 5.7.11 encryption required for requested authentication mechanism")
                    elif verb == "AUTH":
                        parts = arg.split()
                        if parts[0].upper() == "PLAIN":
                            blob = parts[1] if len(parts) > 1 else None
                            if blob is None:
                                self.reply("334 ")
                                blob = self.rfile.readline().decode().strip()
                            _, u, p = base64.b64decode(blob).decode().split("\0")
                        else:  # LOGIN
                            self.reply("334 VXNlcm5hbWU6")
                            u = base64.b64decode(self.rfile.readline().strip()).decode()
                            self.reply("334 UGFzc3dvcmQ6")
                            p = base64.b64decode(self.rfile.readline().strip()).decode()
                        if u == username and p == password:
                            authed = True
                            outer.auth_ok.append(u)
                            self.reply("235 2.7.0 Authentication successful")
                        else:
                            self.reply("535 5.7.8 Authentication credentials invalid")
                    elif verb == "MAIL":
                        if not authed:
                            self.reply("530 5.7.0 Authentication required")
                            continue
                        mail_from, rcpts = arg.split(":", 1)[1].strip().strip("<>").split(">")[0], []
                        self.reply("250 OK")
                    elif verb == "RCPT":
                        rcpts.append(arg.split(":", 1)[1].strip().strip("<>"))
                        self.reply("250 OK")
                    elif verb == "DATA":
                        self.reply("354 End data with <CR><LF>.<CR><LF>")
                        lines = []
                        while True:
                            d = self.rfile.readline()
                            if d in (b".\r\n", b".\n", b""):
                                break
                            lines.append(d[1:] if d.startswith(b"..") else d)
                        if fail_data:
                            self.reply("451 4.3.0 try again later")
                            continue
                        outer.messages.append({"from": mail_from, "to": rcpts, "data": b"".join(lines),
                                               "tls": secure})
                        self.reply("250 2.0.0 queued")
                    elif verb == "RSET":
                        mail_from, rcpts = None, []
                        self.reply("250 OK")
                    elif verb == "NOOP":
                        self.reply("250 OK")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    else:
                        self.reply("502 command not implemented")

        class S(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self.server = S(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ---- a real (quick) digest ----------------------------------------------------------------------

FAST = {"forecast": {"models": ["snaive_day"]}}


@pytest.fixture(scope="module")
def files():
    settings = demo_settings(from_dict(FAST, "<test>"))
    inp, _ = demo_input(WEEK_END, days=9)
    digest = build_digest(inp, settings)
    return digest["iso_week"], render_files(digest)


def settings_with(dests: list[dict], tmp_path, retry=None) -> DigestSettings:
    d = {"outbox": str(tmp_path / "outbox.sqlite"), "destinations": dests, **FAST}
    if retry:
        d["retry"] = retry
    return from_dict(d, "<test>")


# ---- tests ----------------------------------------------------------------------------------------

def test_webhook_delivery_is_slack_shaped_and_idempotent(files, tmp_path, monkeypatch):
    week, payload = files
    rx = Receiver()
    try:
        token = tmp_path / "token"
        token.write_text("tok-s3cret-123\n")
        monkeypatch.setenv("DIGEST_HOOK_URL", f"http://127.0.0.1:{rx.port}/hooks/T000/B000/XyZsecret")
        s = settings_with([{"name": "slack", "type": "webhook", "url_env": "DIGEST_HOOK_URL",
                            "bearer_token_file": str(token)}], tmp_path)
        with Outbox(s.outbox, s.retry) as box:
            assert box.enqueue(week, payload, ["slack"], now=100.0) == [f"{week}:slack"]
            assert box.drain(senders_for(s.destinations), now=100.0) == {f"{week}:slack": "done"}
            # the same week queued again (a rerun): nothing new, nothing re-sent
            assert box.enqueue(week, payload, ["slack"], now=200.0) == []
            assert box.drain(senders_for(s.destinations), now=10_000.0) == {}
            assert box.pending_count() == 0
            assert dict((n, v) for n, _, v in metric_samples(box)) == {
                "headroom_digest_pending_deliveries": 0.0,
                "headroom_digest_last_success_timestamp_seconds": 100.0}
        assert len(rx.received) == 1
        got = rx.received[0]
        assert got["path"] == "/hooks/T000/B000/XyZsecret"
        assert got["headers"]["Authorization"] == "Bearer tok-s3cret-123"
        assert got["headers"]["Idempotency-Key"] == f"{week}:slack"
        body = got["body"]
        assert set(body) == {"text", "blocks"}
        assert week in body["text"] and "agent-70b" in body["text"]
        assert body["blocks"][0]["type"] == "header"
        pools = [b for b in body["blocks"] if b["type"] == "section" and "fields" in b]
        assert len(pools) == 2
    finally:
        rx.close()


def test_smtp_multipart_with_inline_charts_and_auth(files, tmp_path):
    week, payload = files
    pw = tmp_path / "smtp-password"
    pw.write_text("hunter2-smtp\n")
    srv = SmtpServer(username="digest", password="hunter2-smtp")
    try:
        s = settings_with([{"name": "mail", "type": "smtp", "host": "127.0.0.1", "port": srv.port,
                            "username": "digest", "password_file": str(pw),
                            "from": "headroom@example.org", "to": ["ops@example.org", "cfo@example.org"]}],
                          tmp_path)
        with Outbox(s.outbox, s.retry) as box:
            box.enqueue(week, payload, ["mail"], now=0.0)
            assert box.drain(senders_for(s.destinations), now=0.0) == {f"{week}:mail": "done"}
        assert srv.auth_ok == ["digest"]
        assert len(srv.messages) == 1
        m = srv.messages[0]
        assert m["from"] == "headroom@example.org"
        assert sorted(m["to"]) == ["cfo@example.org", "ops@example.org"]
        msg = email.message_from_bytes(m["data"], policy=email.policy.default)
        assert msg["X-Headroom-Idempotency-Key"] == f"{week}:mail"
        assert msg.get_content_type() == "multipart/alternative"
        text = msg.get_body(preferencelist=("plain",)).get_content()
        assert "agent-70b" in text and "Recommendations" in text
        html_part = msg.get_body(preferencelist=("html",))
        html = html_part.get_content()
        images = [p for p in msg.walk() if p.get_content_type() == "image/png"]
        meta = json.loads(payload["meta.json"])
        assert len(images) == len(meta["charts"]) == 4
        for img in images:
            cid = img["Content-ID"].strip("<>")
            assert f'src="cid:{cid}"' in html  # every inline image is referenced by the HTML
            assert img.get_content()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "data:image/png" not in html  # the e-mail uses cid:, not data: URIs
    finally:
        srv.close()


def test_smtp_starttls_then_auth(files, tmp_path):
    import ssl
    week, payload = files
    cert, key = self_signed_cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    pw = tmp_path / "pw"
    pw.write_text("tls-only-secret")
    srv = SmtpServer(username="digest", password="tls-only-secret", tls=ctx)
    try:
        base = {"type": "smtp", "host": "127.0.0.1", "port": srv.port, "username": "digest",
                "password_file": str(pw), "from": "h@example.org", "to": ["ops@example.org"]}
        s = settings_with([{**base, "name": "tls", "starttls": True, "ca_file": str(cert)},
                           {**base, "name": "plain"}], tmp_path)
        with Outbox(s.outbox, s.retry) as box:
            box.enqueue(week, payload, ["tls", "plain"], now=0.0)
            out = box.drain(senders_for(s.destinations), now=0.0)
            assert out == {f"{week}:tls": "done", f"{week}:plain": "retry"}
            plain = [d for d in box.deliveries() if d.destination == "plain"][0]
            assert "538" in plain.last_error  # the server refuses AUTH before STARTTLS
        assert len(srv.messages) == 1 and srv.messages[0]["tls"] is True
        assert srv.auth_ok == ["digest"]
    finally:
        srv.close()


def test_smtp_without_250_after_data_stays_pending(files, tmp_path):
    week, payload = files
    srv = SmtpServer(fail_data=True)
    try:
        s = settings_with([{"name": "mail", "type": "smtp", "host": "127.0.0.1", "port": srv.port,
                            "from": "h@example.org", "to": ["ops@example.org"]}], tmp_path,
                          retry={"initial": "30s"})
        with Outbox(s.outbox, s.retry) as box:
            box.enqueue(week, payload, ["mail"], now=0.0)
            assert box.drain(senders_for(s.destinations), now=0.0) == {f"{week}:mail": "retry"}
            (d,) = box.deliveries()
            assert d.state == "pending" and d.attempts == 1 and d.next_attempt == 30.0
            assert "451" in d.last_error
    finally:
        srv.close()


def test_receiver_down_then_up_delivers_exactly_once_with_backoff(files, tmp_path, caplog):
    week, payload = files
    port = free_port()  # nothing listens here yet: the receiver is down
    s = settings_with([{"name": "hook", "type": "webhook",
                        "url": f"http://127.0.0.1:{port}/hooks/SECRET-IN-URL", "timeout": "2s"},
                       {"name": "files", "type": "directory", "path": str(tmp_path / "out")}],
                      tmp_path, retry={"initial": "10s", "factor": 2, "max": "1h"})
    caplog.set_level("DEBUG")
    with Outbox(s.outbox, s.retry) as box:
        box.enqueue(week, payload, ["hook", "files"], now=1000.0)
        out = box.drain(senders_for(s.destinations), now=1000.0)
        assert out == {f"{week}:hook": "retry", f"{week}:files": "done"}
        assert os.path.isfile(tmp_path / "out" / week / "digest.html")
        assert box.drain(senders_for(s.destinations), now=1005.0) == {}  # not due before the backoff
        assert box.drain(senders_for(s.destinations), now=1010.0) == {f"{week}:hook": "retry"}
        hook = [d for d in box.deliveries() if d.destination == "hook"][0]
        assert hook.attempts == 2 and hook.next_attempt == 1010.0 + 20.0  # 10 s, then 20 s
        # half the week's destinations done: no "last success" yet, one pending
        assert dict((n, v) for n, _, v in metric_samples(box)) == {"headroom_digest_pending_deliveries": 1.0}
        rx = Receiver(port)
        try:
            assert box.drain(senders_for(s.destinations), now=1030.0) == {f"{week}:hook": "done"}
            assert box.drain(senders_for(s.destinations), now=99_999.0) == {}
            assert len(rx.received) == 1
        finally:
            rx.close()
        assert box.last_success() == 1030.0
        assert "SECRET-IN-URL" not in caplog.text
        assert all("SECRET-IN-URL" not in (d.last_error or "") for d in box.deliveries())


def test_secrets_never_reach_logs_or_outbox(files, tmp_path, caplog, monkeypatch):
    week, payload = files
    monkeypatch.setenv("DIGEST_SMTP_PW", "pa55-w0rd-xyzzy")
    srv = SmtpServer(username="digest", password="something-else")  # wrong password: 535
    rx = Receiver(status=500)
    caplog.set_level("DEBUG")
    try:
        s = settings_with([
            {"name": "mail", "type": "smtp", "host": "127.0.0.1", "port": srv.port, "username": "digest",
             "password_env": "DIGEST_SMTP_PW", "from": "h@example.org", "to": ["ops@example.org"]},
            {"name": "hook", "type": "webhook", "url": f"http://127.0.0.1:{rx.port}/T1/B2/tok-abcdef",
             "bearer_token_env": "DIGEST_SMTP_PW"}], tmp_path)
        with Outbox(s.outbox, s.retry) as box:
            box.enqueue(week, payload, ["mail", "hook"], now=0.0)
            assert set(box.drain(senders_for(s.destinations), now=0.0).values()) == {"retry"}
            errors = " ".join(d.last_error for d in box.deliveries())
        assert "535" in errors and "HTTP 500" in errors
        secret_forms = ["pa55-w0rd-xyzzy", base64.b64encode(b"\0digest\0pa55-w0rd-xyzzy").decode(),
                        base64.b64encode(b"pa55-w0rd-xyzzy").decode(), "tok-abcdef"]
        for secret in secret_forms:
            assert secret not in caplog.text
            assert secret not in errors
        raw = sqlite3.connect(s.outbox).execute("SELECT group_concat(last_error) FROM deliveries").fetchone()[0]
        assert "pa55" not in raw
    finally:
        srv.close()
        rx.close()


def _pending_attempts(path: str) -> int:
    if not os.path.exists(path):
        return 0
    try:
        con = sqlite3.connect(path, timeout=5)
        try:
            row = con.execute("SELECT max(attempts) FROM deliveries WHERE state = 'pending'").fetchone()
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0
    return int(row[0] or 0)


def demo_digest_command(tmp_path, port: int, retry: str, timeout: str):
    """(outbox path, `headroom digest --demo` command line) delivering to a webhook on `port`."""
    outbox = tmp_path / "outbox.sqlite"
    cfg = tmp_path / "headroom.yaml"
    cfg.write_text(f"""
sources:
  prometheus: {{url: "http://127.0.0.1:9"}}
digest:
  outbox: {outbox}
  forecast: {{models: [snaive_day]}}
  retry: {retry}
  destinations:
    - {{name: hook, type: webhook, url: "http://127.0.0.1:{port}/hook", timeout: {timeout}}}
""")
    return outbox, [PY, "-m", "monitor", "digest", "--demo", "--config.file", str(cfg), "--days", "9",
                    "--week-end", "2025-12-01T00:00:00"]


def test_sigkill_during_pending_delivery_then_restart_delivers_exactly_once(tmp_path):
    port = free_port()
    outbox, cmd = demo_digest_command(tmp_path, port, "{initial: 1s, factor: 2, max: 4s}", "2s")
    child = subprocess.Popen(cmd + ["--wait", "10m"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while _pending_attempts(str(outbox)) < 2:  # built, queued, failed twice, backing off
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the child never got to a pending delivery"
            time.sleep(0.2)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        assert child.returncode == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(30)
    rx = Receiver(port)
    try:
        # a new process: the week is already queued, so it is neither rebuilt nor re-queued; it
        # waits out the backoff the killed process persisted, then delivers
        again = subprocess.run(cmd + ["--wait", "5m"], cwd=ROOT, capture_output=True, timeout=600)
        assert again.returncode == 0, again.stderr.decode()[-2000:]
        result = json.loads(again.stdout.decode().strip().splitlines()[-1])
        assert result["queued"] == []
        outcomes = [result["outcomes"]] + result.get("retries", [])
        assert [o for o in outcomes if o] == [{"2025-W48:hook": "done"}]
        assert result["pending"] == 0
        third = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=600)
        assert third.returncode == 0
        assert len(rx.received) == 1
        assert rx.received[0]["headers"]["Idempotency-Key"] == "2025-W48:hook"
    finally:
        rx.close()


def test_sigkill_while_the_request_is_in_flight_resends_once_after_the_lease(tmp_path):
    """The receiver holds the first POST without answering; the sender is killed mid-request. The
    delivery was never acknowledged, so a new process sends it again, once, after the lease."""
    rx = Receiver(hold_first=True)
    outbox, cmd = demo_digest_command(tmp_path, rx.port, "{initial: 1s}", "10m")
    try:
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        try:
            assert rx.arrived.wait(600), "the child never sent the webhook"
            os.kill(child.pid, signal.SIGKILL)
            child.wait(30)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(30)
        assert rx.received == []
        con = sqlite3.connect(str(outbox))
        state, lease = con.execute("SELECT state, lease_until FROM deliveries").fetchone()
        con.close()
        assert state == "pending" and lease is not None  # the killed sender's lease is left behind
        # a lease of 2 x 10 min + 30 s is long: make the restart use a short timeout (and lease)
        cfg = tmp_path / "headroom.yaml"
        cfg.write_text(cfg.read_text().replace("timeout: 10m", "timeout: 5s"))
        lease_until = time.time() + 6  # a few seconds past the restart's start-up on a quiet machine
        con = sqlite3.connect(str(outbox))
        con.execute("UPDATE deliveries SET lease_until = ?", (lease_until,))
        con.commit()
        con.close()
        again = subprocess.run(cmd + ["--wait", "5m"], cwd=ROOT, capture_output=True, timeout=600)
        assert again.returncode == 0, again.stderr.decode()[-2000:]
        assert len(rx.received) == 1
        assert rx.received[0]["headers"]["Idempotency-Key"] == "2025-W48:hook"
        assert rx.received[0]["at"] >= lease_until, "resent before the killed sender's lease ran out"
    finally:
        rx.close()


# ---- deadlines (issue #20 part 7) ------------------------------------------------------------------

def _slow(mode):
    from hostile import HostileServer
    return HostileServer("HTTP/1.1 200 OK\r\n" * 40, mode, pace=0.25)


@pytest.mark.parametrize("kind", ["webhook", "smtp"])
def test_a_trickling_destination_fails_within_its_timeout_and_under_the_lease(files, tmp_path, kind):
    """The server sends a byte every 0.25 s: every socket read gets data, only a total deadline ends it."""
    week, payload = files
    slow = _slow("trickle_headers")
    url = tmp_path / "url"
    url.write_text(slow.url("/hook"))
    dest = ({"type": "webhook", "name": "slow", "url_file": str(url), "timeout": "1s"} if kind == "webhook" else
            {"type": "smtp", "name": "slow", "host": "127.0.0.1", "port": slow.port, "from": "h@example.org",
             "to": ["ops@example.org"], "timeout": "1s"})
    s = settings_with([dest], tmp_path)
    try:
        with Outbox(s.outbox, s.retry) as box:
            box.enqueue(week, payload, ["slow"], now=0.0)
            t0 = time.monotonic()
            out = box.drain(senders_for(s.destinations), now=0.0)
            took = time.monotonic() - t0
            [d] = box.deliveries()
    finally:
        slow.stop()
    assert out == {f"{week}:slow": "retry"}
    assert 0.9 < took < 2.0, took  # the 1-s timeout, not the server's pace x its 680 bytes
    assert took < open_outbox(s).lease_seconds
    assert ("timeout" in d.last_error) if kind == "webhook" else ("within 1s" in d.last_error), d.last_error


def test_a_slow_destination_holds_none_of_the_others(files, tmp_path):
    week, payload = files
    slow = _slow("silent")
    url = tmp_path / "url"
    url.write_text(slow.url("/hook"))
    rx = Receiver()
    fast_url = tmp_path / "fast-url"
    fast_url.write_text(f"http://127.0.0.1:{rx.port}/hook")
    s = settings_with([{"type": "webhook", "name": "slow", "url_file": str(url), "timeout": "2s"},
                       {"type": "webhook", "name": "fast", "url_file": str(fast_url), "timeout": "2s"},
                       {"type": "directory", "name": "disk", "path": str(tmp_path / "out")}], tmp_path)
    try:
        with Outbox(s.outbox, s.retry) as box:
            box.enqueue(week, payload, ["slow", "fast", "disk"], now=0.0)
            t0 = time.monotonic()
            out = box.drain(senders_for(s.destinations), now=0.0)
            took = time.monotonic() - t0
            delivered = {d.destination: d.delivered for d in box.deliveries() if d.state == "done"}
    finally:
        slow.stop()
        rx.close()
    assert out == {f"{week}:slow": "retry", f"{week}:fast": "done", f"{week}:disk": "done"}
    assert set(delivered) == {"fast", "disk"} and len(rx.received) == 1
    assert took < 3.0, took  # the slow one's 2 s, in parallel with the others


def test_sharded_daemons_deliver_every_shards_pools_under_their_own_keys(tmp_path):
    """Two daemons sharding one fleet (`--shard 0/2`, `1/2`: chat-8b and agent-70b apart) post to one
    receiver that keeps the first body per Idempotency-Key: it keeps both shards' pools (with one
    key per week it kept one shard's). A second run of a shard in the same week sends nothing."""
    from monitor.digest.schedule import HistoryBuild, run_digest
    from monitor.digest.sources import from_store
    from monitor.history.store import HistoryStore
    from monitor.model.shard import owner
    inp, _ = demo_input(WEEK_END, days=9)
    assert {p.name: owner(p.name, 2) for p in inp.pools} == {"chat-8b": 0, "agent-70b": 1}
    rx = Receiver()
    with HistoryStore(str(tmp_path / "h.sqlite"), retention_seconds=None, downsample_after_seconds=None) as st:
        st.append((p.name, k, float(t), float(v)) for p in inp.pools for k, s in p.series.items()
                  for t, v in s.items())
        try:
            for i in (0, 1):
                (tmp_path / f"s{i}").mkdir()
                s = from_dict({**FAST, "outbox": str(tmp_path / f"s{i}" / "outbox.sqlite"),
                               "destinations": [
                                   {"name": "hook", "type": "webhook", "url": f"http://127.0.0.1:{rx.port}/h"},
                                   {"name": "archive", "type": "directory", "path": str(tmp_path / "archive")}]},
                              "<test>", pools={p.name: PoolSettings(replicas=p.replicas) for p in inp.pools})
                build = HistoryBuild(lambda week_end, sh=(i, 2), s=s: from_store(st, week_end, s, shard=sh), (i, 2))
                with open_outbox(s) as box:
                    r = run_digest(s, build, WEEK_END + 60, box)
                    edition = f"2025-W48-shard-{i}-of-2"
                    assert r["week"] == edition and r["pending"] == 0
                    assert sorted(r["queued"]) == [f"{edition}:archive", f"{edition}:hook"]
                    again = run_digest(s, build, WEEK_END + 120, box)
                    assert again["queued"] == [] and again["outcomes"] == {}
        finally:
            rx.close()
    kept: dict[str, dict] = {}
    for got in rx.received:  # a de-duplicating receiver
        kept.setdefault(got["headers"]["Idempotency-Key"], got["body"])
    assert len(rx.received) == 2
    assert sorted(kept) == ["2025-W48-shard-0-of-2:hook", "2025-W48-shard-1-of-2:hook"]
    pools = {k: [b["text"]["text"] for b in body["blocks"] if b["type"] == "section" and "fields" in b]
             for k, body in kept.items()}
    assert pools == {"2025-W48-shard-0-of-2:hook": ["*Pool chat-8b*"], "2025-W48-shard-1-of-2:hook": ["*Pool agent-70b*"]}
    for i, pool in ((0, "chat-8b"), (1, "agent-70b")):
        doc = json.loads((tmp_path / "archive" / f"2025-W48-shard-{i}-of-2" / "digest.json").read_text())
        assert [p["name"] for p in doc["pools"]] == [pool] and doc["shard"] == f"{i}/2"
