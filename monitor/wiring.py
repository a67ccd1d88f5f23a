"""Wires the optional layers (capacity, tasks, forecasts, web security) into the daemon.

Kept apart from cycle.py so the pipeline stays small and each layer can be absent.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import ssl
from typing import Callable, Optional

import yaml

from .config import Config, ConfigError

log = logging.getLogger(__name__)


def default_enrichers(cfg: Config) -> list:
    enrichers = []
    try:
        from .capacity.enrich import make_enricher  # noqa: PLC0415
    except ImportError:
        make_enricher = None
    if make_enricher is not None:
        enrichers.append(make_enricher(cfg))
    return enrichers


def extra_samples(daemon) -> list[tuple[str, dict[str, str], float]]:
    p = daemon.pipeline
    out = [("headroom_cycles", {}, float(p.cycles))]
    for what, v in sorted(p.dropped.items()):
        out.append(("headroom_dropped_series", {"what": what}, v))
    for kind, v in sorted(p.anomalies.items()):
        out.append(("headroom_input_anomalies", {"kind": kind}, v))
    for hook in getattr(daemon, "sample_hooks", []):
        out.extend(hook())
    return out


# ---- web security: exporter-toolkit style web config -------------------------------------------

WEB_KEYS = {"tls_server_config", "basic_auth_users"}


def web_security(path: Optional[str]) -> tuple[Callable[[Optional[str]], bool], Optional[ssl.SSLContext]]:
    """(authorize(header) -> bool, ssl_context or None) from a web-config file; open when no file."""
    if not path:
        return (lambda header: True), None
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, "", f"not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping")
    for k in data:
        if k not in WEB_KEYS:
            raise ConfigError(path, str(k), f"unknown key (allowed: {', '.join(sorted(WEB_KEYS))})")
    ctx = None
    tls = data.get("tls_server_config")
    if tls:
        if not isinstance(tls, dict) or "cert_file" not in tls or "key_file" not in tls:
            raise ConfigError(path, "tls_server_config", "needs cert_file and key_file")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(tls["cert_file"], tls["key_file"])
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(path, "tls_server_config", f"cannot load certificate: {exc}") from None
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
        raise ConfigError(path, "basic_auth_users", "expected a mapping of user names to bcrypt hashes")
    for user, hashed in users.items():
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(path, f"basic_auth_users.{user}", "not a bcrypt hash (expected $2a$/$2b$/$2y$...)")
    if not users:
        return (lambda header: True), ctx
    return _basic_auth(users), ctx


def _basic_auth(users: dict[str, str]) -> Callable[[Optional[str]], bool]:
    import bcrypt  # noqa: PLC0415

    verified: dict[bytes, str] = {}  # sha256(header) -> user, so bcrypt runs once per credential

    def authorize(header: Optional[str]) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        digest = hashlib.sha256(header.encode()).digest()
        user_hit = verified.get(digest)
        if user_hit is not None:
            return user_hit in users
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = users.get(user)
        if hashed is None:
            return False
        ok = bcrypt.checkpw(password.encode(), hashed.encode())
        if ok:
            if len(verified) > 1000:
                verified.clear()
            verified[digest] = user
        return ok

    return authorize
