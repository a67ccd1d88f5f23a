"""The web-config file (`--web.config.file`, the exporter-toolkit format) for headroom's own endpoints.

Every key is either honoured or refused with `file: key: problem`; nothing is silently ignored.
What Python's ssl module (or OpenSSL 3's defaults) cannot do is refused with the reason: a client
certificate requested but not verified, more than one curve, TLS 1.0/1.1, inline certificates and
keys, HTTP/2, custom headers, rate limiting.
Relative file names are taken from the web-config file's directory, as exporter-toolkit does.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import ssl
import time
from typing import Any, Callable, NoReturn, Optional

import yaml

from monitor.kit.settings.reader import ConfigError
from monitor.kit.web.auth import BasicAuth

log = logging.getLogger(__name__)

Authorize = Callable[[Optional[str]], bool]

WEB_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
REFUSED_TOP = {"rate_limit": "not supported by headroom (put a rate-limiting proxy in front of it)"}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "client_ca", "client_allowed_sans",
            "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites", "curve_preferences",
            "cert", "key"}
HTTP_KEYS = {"http2", "headers"}

VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
OLD_VERSIONS = {"TLS10", "TLS11"}  # OpenSSL 3 offers no cipher for them at its default security level

# Go's crypto/tls names (those tls.CipherSuites() returns, the ones exporter-toolkit accepts) -> OpenSSL.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3 suites are not configurable in Go either: accepted, and TLS 1.3 keeps OpenSSL's own three.
TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
INSECURE_CIPHERS = {
    "TLS_RSA_WITH_RC4_128_SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA", "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", "TLS_ECDHE_RSA_WITH_RC4_128_SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}

CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
CLIENT_AUTH_REFUSED = {
    name: "cannot be honoured: Python's ssl verifies every client certificate it asks for; use "
          "RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"
    for name in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")}

BCRYPT_RE = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
# The highest bcrypt cost accepted. Each step doubles the work: cost 12 (htpasswd's and most tools'
# default) takes ~0.25 s on one core, 14 ~1 s; every request with new credentials (and every unknown
# user, checked against a dummy of the same cost) holds a worker that long, and start-up validates each
# hash once. 31 would take hours (start-up blocked, SIGTERM unheard); Apache's htpasswd stops at 17.
MAX_BCRYPT_COST = 14


class ServerTLS(ssl.SSLContext):
    """The server's SSLContext plus what the handshake alone does not check: the client certificate's
    allowed SANs. Picks up a rotated certificate (cert_file / key_file changed on disk) for new
    connections, checked at most every `reload_every` seconds."""

    reload_every = 5.0

    def setup(self, cert_file: str, key_file: str, allowed_sans: Optional[frozenset[str]]) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.client_allowed_sans = allowed_sans
        self._stamp = self._files_stamp()
        self._checked = time.monotonic()

    def _files_stamp(self) -> Optional[tuple[tuple[int, int, int], ...]]:
        try:
            return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in map(os.stat, (self.cert_file, self.key_file)))
        except OSError:
            return None

    def maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.reload_every:
            return
        self._checked = now
        stamp = self._files_stamp()
        if stamp is None or stamp == self._stamp:
            return
        try:
            self.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("web TLS: cannot reload %s / %s, keeping the previous certificate: %s",
                        self.cert_file, self.key_file, getattr(exc, "reason", None) or exc)
            return
        self._stamp = stamp
        log.info("web TLS: reloaded the certificate from %s", self.cert_file)

    def peer_allowed(self, sock: ssl.SSLSocket) -> bool:
        """True when no SAN list is configured, or the verified client certificate names one of them."""
        if self.client_allowed_sans is None:
            return True
        cert = sock.getpeercert() or {}
        alt = cert.get("subjectAltName", ())  # ((kind, value), ...)
        sans = {pair[1] for pair in alt if isinstance(pair, tuple)} if isinstance(alt, tuple) else set()
        return bool(sans & self.client_allowed_sans)


def web_security(path: Optional[str]) -> tuple[Authorize, Optional[ssl.SSLContext]]:
    """(authorize(header) -> bool, ssl_context or None) from a web-config file; open when no file."""
    if not path:
        return _open, None
    data = _read_yaml(path)
    for k in data:
        if k in REFUSED_TOP:
            raise ConfigError(path, str(k), REFUSED_TOP[k])
        if k not in WEB_KEYS:
            raise ConfigError(path, str(k), f"unknown key (allowed: {', '.join(sorted(WEB_KEYS))})")
    _http_server_config(path, data.get("http_server_config"))
    base = os.path.dirname(os.path.abspath(path))
    tls = data.get("tls_server_config")
    ctx = tls_context(path, tls, base) if tls else None
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
        raise ConfigError(path, "basic_auth_users", "expected a mapping of user names to bcrypt hashes")
    return (basic_auth(path, users) if users else _open), ctx


def _open(header: Optional[str]) -> bool:
    return True


def _no_passphrase() -> NoReturn:
    """Called by OpenSSL only for an encrypted key: fail instead of prompting on the terminal."""
    raise ValueError("key_file is encrypted (headroom reads an unencrypted PEM key)")


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, "", f"not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping")
    return data


def _http_server_config(path: str, http: Any) -> None:
    if http is None:
        return
    if not isinstance(http, dict):
        raise ConfigError(path, "http_server_config", "expected a mapping")
    for k, v in http.items():
        key = f"http_server_config.{k}"
        if k not in HTTP_KEYS:
            raise ConfigError(path, key, f"unknown key (allowed: {', '.join(sorted(HTTP_KEYS))})")
        if k == "http2" and v is not False:
            raise ConfigError(path, key, "HTTP/2 is not supported (headroom serves HTTP/1.1): set http2: false")
        if k == "headers" and v:
            raise ConfigError(path, key, "custom response headers are not supported "
                                         "(responses carry X-Content-Type-Options: nosniff)")


def _tls_str(path: str, tls: dict[str, Any], key: str, base: Optional[str] = None) -> Optional[str]:
    value = tls.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"tls_server_config.{key}", "expected a non-empty string")
    return os.path.join(base, value) if base else value


def _tls_list(path: str, tls: dict[str, Any], key: str) -> list[str]:
    value = tls.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, f"tls_server_config.{key}", "expected a list of strings")
    return value


def tls_context(path: str, tls: Any, base: str) -> ServerTLS:
    """A server SSLContext honouring every tls_server_config key, or ConfigError."""
    if not isinstance(tls, dict):
        raise ConfigError(path, "tls_server_config", "expected a mapping")
    for k in tls:
        if k not in TLS_KEYS:
            raise ConfigError(path, f"tls_server_config.{k}", f"unknown key (allowed: {', '.join(sorted(TLS_KEYS))})")
    for inline, use in (("cert", "cert_file"), ("key", "key_file")):
        if inline in tls:
            raise ConfigError(path, f"tls_server_config.{inline}", f"inline PEM is not supported: put it in a file and use {use}")
    cert_file, key_file = _tls_str(path, tls, "cert_file", base), _tls_str(path, tls, "key_file", base)
    if not cert_file or not key_file:
        raise ConfigError(path, "tls_server_config", "needs cert_file and key_file")
    ctx = ServerTLS(ssl.PROTOCOL_TLS_SERVER)
    _versions(path, tls, ctx)
    try:
        ctx.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(path, "tls_server_config", f"cannot load certificate: {exc}") from None
    _client_auth(path, tls, ctx, base)
    _ciphers(path, tls, ctx)
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise ConfigError(path, "tls_server_config.prefer_server_cipher_suites", "expected true or false")
    if prefer:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = _tls_list(path, tls, "curve_preferences")
    for name in curves:
        if name not in CURVES:
            raise ConfigError(path, "tls_server_config.curve_preferences",
                              f"unknown curve {name!r} (known: {', '.join(CURVES)})")
    if len(curves) > 1:
        raise ConfigError(path, "tls_server_config.curve_preferences",
                          "Python's ssl can restrict the handshake to one curve only: list exactly one")
    if curves:
        ctx.set_ecdh_curve(CURVES[curves[0]])
    sans = tls.get("client_allowed_sans")
    allowed = None
    if sans is not None:
        allowed = frozenset(_tls_list(path, tls, "client_allowed_sans"))
        if ctx.verify_mode == ssl.CERT_NONE:
            raise ConfigError(path, "tls_server_config.client_allowed_sans",
                              "needs client_auth_type RequireAndVerifyClientCert or VerifyClientCertIfGiven")
    ctx.setup(cert_file, key_file, allowed)
    return ctx


def _versions(path: str, tls: dict[str, Any], ctx: ssl.SSLContext) -> None:
    chosen = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = tls.get(key, default)
        if name in OLD_VERSIONS:
            raise ConfigError(path, f"tls_server_config.{key}", f"{name} cannot be honoured: OpenSSL 3 refuses "
                                                                "TLS 1.0 and 1.1 at its default security level (use TLS12)")
        if not isinstance(name, str) or name not in VERSIONS:
            raise ConfigError(path, f"tls_server_config.{key}", f"unknown TLS version {name!r} (known: {', '.join(VERSIONS)})")
        chosen[key] = VERSIONS[name]
    if chosen["min_version"] > chosen["max_version"]:
        raise ConfigError(path, "tls_server_config.min_version", "is above max_version")
    ctx.minimum_version = chosen["min_version"]
    ctx.maximum_version = chosen["max_version"]


def _client_auth(path: str, tls: dict[str, Any], ctx: ssl.SSLContext, base: str) -> None:
    key = "tls_server_config.client_auth_type"
    mode = tls.get("client_auth_type", "NoClientCert")
    if not isinstance(mode, str):
        raise ConfigError(path, key, "expected a string such as RequireAndVerifyClientCert")
    if mode in CLIENT_AUTH_REFUSED:
        raise ConfigError(path, key, f"{mode} {CLIENT_AUTH_REFUSED[mode]}")
    if mode not in CLIENT_AUTH:
        known = ", ".join(list(CLIENT_AUTH) + list(CLIENT_AUTH_REFUSED))
        raise ConfigError(path, key, f"unknown value {mode!r} (known: {known})")
    ca_file, ca_text = _tls_str(path, tls, "client_ca_file", base), _tls_str(path, tls, "client_ca")
    if ca_file and ca_text:
        raise ConfigError(path, "tls_server_config.client_ca", "give client_ca_file or client_ca, not both")
    if CLIENT_AUTH[mode] == ssl.CERT_NONE:
        if ca_file or ca_text:
            raise ConfigError(path, "tls_server_config.client_ca_file",
                              "a client CA is configured but client_auth_type is NoClientCert: "
                              "set client_auth_type: RequireAndVerifyClientCert")
        return
    if not (ca_file or ca_text):
        raise ConfigError(path, key, f"{mode} needs client_ca_file (the CA that signs client certificates)")
    try:
        ctx.load_verify_locations(cafile=ca_file, cadata=ca_text)
    except (OSError, ssl.SSLError, ValueError) as exc:
        which = "client_ca_file" if ca_file else "client_ca"
        raise ConfigError(path, f"tls_server_config.{which}", f"cannot load the client CA: {exc}") from None
    ctx.verify_mode = CLIENT_AUTH[mode]


def _ciphers(path: str, tls: dict[str, Any], ctx: ssl.SSLContext) -> None:
    key = "tls_server_config.cipher_suites"
    names = _tls_list(path, tls, key.split(".")[1])
    wanted = []
    for name in names:
        if name in INSECURE_CIPHERS:
            raise ConfigError(path, key, f"{name} is insecure and not accepted (exporter-toolkit refuses it too)")
        if name in TLS13_SUITES:
            continue
        if name not in CIPHERS:
            raise ConfigError(path, key, f"unknown cipher suite {name!r} (Go names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
        wanted.append(CIPHERS[name])
    if not wanted:
        return
    try:
        ctx.set_ciphers(":".join(wanted))
    except ssl.SSLError:
        raise ConfigError(path, key, "none of these suites is available in this OpenSSL build") from None
    have = {c["name"] for c in ctx.get_ciphers()}
    missing = [go for go in names if go in CIPHERS and CIPHERS[go] not in have]
    if missing:
        raise ConfigError(path, key, f"not available in this OpenSSL build: {', '.join(missing)}")


def basic_auth(path: str, users: dict[str, str]) -> BasicAuth:
    """authorize(header): bcrypt-checked basic auth (monitor/kit/web/auth.py: successful checks
    remembered for a while). Every hash is validated here; an unknown user is checked against a dummy
    hash of the same cost, so the answer takes as long as for a known one."""
    import bcrypt  # noqa: PLC0415

    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not BCRYPT_RE.match(hashed):
            raise ConfigError(path, f"basic_auth_users.{user}",
                              "not a bcrypt hash (expected $2a$/$2b$/$2y$, a cost 04-31 and 53 characters)")
        if int(hashed[4:6]) > MAX_BCRYPT_COST:  # refused before anything is hashed
            raise ConfigError(path, f"basic_auth_users.{user}",
                              f"bcrypt cost {int(hashed[4:6])} is above {MAX_BCRYPT_COST}, the most a check can "
                              f"do in time (each step doubles it; start-up and every new login would wait); hash "
                              f"the password again with a cost of {MAX_BCRYPT_COST} or less (htpasswd -B -C 12)")
        try:
            bcrypt.checkpw(b"x", hashed.encode())
        except ValueError as exc:
            raise ConfigError(path, f"basic_auth_users.{user}", f"not a valid bcrypt hash: {exc}") from None
        hashes[user] = hashed.encode()
    cost = max(int(h[4:6]) for h in hashes.values())
    return BasicAuth(hashes, bcrypt.hashpw(secrets.token_bytes(18), bcrypt.gensalt(rounds=cost)))
