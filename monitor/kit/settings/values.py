"""Plain values of the configuration: durations, URLs and secrets, checked without showing a secret."""
from __future__ import annotations

import math
import os
import re
import unicodedata
from typing import Any
from urllib.parse import urlsplit


def type_name(value: Any) -> str:
    """How a YAML value's type is named in an error ("mapping", "list", "string", ...)."""
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__)

DAY = 86400.0
MAX_SECONDS = 3650 * DAY  # ten years: the schedulers and datetime overflow on longer durations
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> float:
    """'15s', '5m', '1.5h', '2d', '1w', or a number of seconds (finite, not negative)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 15s, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite duration, got {value!r}")
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value.strip())
        if m:
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
            if math.isfinite(seconds):
                return seconds
    raise ValueError(f"expected a duration like 15s, 5m or 1h, got {value!r}")


def format_duration(seconds: float) -> str:
    for unit in ("d", "h", "m", "s", "ms"):
        n = seconds / _UNITS[unit]
        if n >= 1 and abs(n - round(n)) < 1e-9:
            return f"{round(n)}{unit}"
    return f"{seconds:g}s"


def redact(url: str) -> str:
    """A URL without its user:password@ part, for messages."""
    u = urlsplit(url)
    if "@" not in u.netloc:
        return url
    return u._replace(netloc=u.netloc.rsplit("@", 1)[1]).geturl()


def check_url(value: Any, secret: bool = False) -> str:
    """An http(s) URL with a host and a valid port; `secret`: never show it (a Slack webhook)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a URL string, got {type_name(value)}")
    shown = "" if secret else f": {redact(value)!r}"
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in value):
        raise ValueError(f"a URL cannot hold spaces or control characters{shown}")
    u = urlsplit(value)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL{shown}")
    try:
        port = u.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"the port must be a number from 1 to 65535{shown}")
    return value


def check_secret(text: str, where: str) -> str:
    """A secret read from `where` (a file or a variable): not empty, no control character."""
    if not text:
        raise ValueError(f"{where} is empty")
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise ValueError(f"{where} holds a control character (a line break inside the secret?); "
                         "the value is not shown")
    return text


def read_secret_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except FileNotFoundError:
        raise ValueError(f"file not found: {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"file {path} is not UTF-8 text; the value is not shown") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return check_secret(text, f"file {path}")


def read_secret_env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"environment variable {name} (named for a secret) is not set")
    return check_secret(value.strip(), f"environment variable {name}")
