"""The kinds of value a setting holds: how each is read, its bounds, and the words the docs use.

`kind.read(reader, value, key)` returns the value or raises the reader's error naming `key`; a
scalar kind only implements `parse(value)`, raising ValueError with the problem. Secrets are read
here only to be checked (present, not empty, no control character); no message carries a value.
"""
from __future__ import annotations

import math
import os
import re
import unicodedata
from typing import Any, Callable, Optional, Sequence, TypeVar, Union
from urllib.parse import urlsplit

from monitor.kit.settings.reader import Reader
from monitor.kit.settings.values import (
    MAX_SECONDS,
    check_url,
    format_duration,
    parse_duration,
    read_secret_env,
    read_secret_file,
    type_name,
)

_Num = TypeVar("_Num", int, float)


class Kind:
    """A scalar kind; subclasses implement parse() and name themselves (a class attribute, or a
    property when the name depends on the instance)."""

    @property
    def name(self) -> str:
        return "value"

    def parse(self, value: Any) -> Any:
        return value

    def read(self, r: Reader, value: Any, key: str) -> Any:
        try:
            return self.parse(value)
        except (ValueError, TypeError) as exc:
            raise r.fail(key, str(exc)) from None

    def show(self, value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(self.show(v) for v in value) + "]"
        return str(value) if not isinstance(value, dict) else ("{}" if not value else str(value))

    def rules(self) -> str:
        return ""

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return []  # (key prefix, section, note) of nested sections, for the docs


class Bounded(Kind):
    def __init__(self, *, ge: Optional[float] = None, gt: Optional[float] = None,
                 le: Optional[float] = None, lt: Optional[float] = None):
        self.bounds = [(op, b) for op, b in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if b is not None]

    def bounded(self, v: _Num) -> _Num:
        for op, b in self.bounds:
            ok = {">=": v >= b, ">": v > b, "<=": v <= b, "<": v < b}[op]
            if not ok:
                raise ValueError(f"must be {op} {self.show(b)}, got {self.show(v)}")
        return v

    def rules(self) -> str:
        return ", ".join(f"{op} {self.show(b)}" for op, b in self.bounds)


# Every count and size is bounded: without its own upper bound a setting is at most LIMIT, so a
# typo such as 1e308 is refused naming the key instead of overflowing what is computed from it.
LIMIT = 10 ** 9


def _capped(bounds: dict[str, Optional[float]]) -> dict[str, Optional[float]]:
    if bounds.get("le") is None and bounds.get("lt") is None:
        bounds["le"] = LIMIT
    return bounds


class Int(Bounded):
    name = "integer"

    def __init__(self, *, whole: bool = False, **bounds: Optional[float]):
        super().__init__(**_capped(bounds))
        self.whole = whole  # also accept 2.0 for 2

    def parse(self, v: Any) -> int:
        if self.whole and isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer, got {v!r}")
        return self.bounded(v)


class Number(Bounded):
    name = "number"

    def __init__(self, **bounds: Optional[float]):
        super().__init__(**_capped(bounds))

    def parse(self, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v!r}")
        return float(self.bounded(v))


class Duration(Bounded):
    name = "duration"

    def __init__(self, **bounds: Optional[float]):
        bounds.setdefault("le", MAX_SECONDS)
        super().__init__(**bounds)

    def parse(self, v: Any) -> float:
        return self.bounded(parse_duration(v))

    def show(self, value: Any) -> str:
        return format_duration(value) if isinstance(value, (int, float)) else super().show(value)


class Text(Kind):
    name = "string"

    def __init__(self, *, pattern: Optional[str] = None, like: str = "", empty: bool = False):
        self.pattern, self.like, self.empty = (re.compile(pattern) if pattern else None), like, empty

    def parse(self, v: Any) -> str:
        if not isinstance(v, str) or not (v.strip() or self.empty):
            raise ValueError(f"expected a {'' if self.empty else 'non-empty '}string, got {v!r}")
        if self.pattern and not self.pattern.match(v):
            raise ValueError(f"use {self.like} (got {v!r})")
        return v

    def rules(self) -> str:
        return self.like


class Flag(Kind):
    name = "boolean"

    def parse(self, v: Any) -> bool:
        if not isinstance(v, bool):
            raise ValueError(f"expected true or false, got {v!r}")
        return v


class Choice(Kind):
    def __init__(self, options: Union[Sequence[Any], Callable[[], Sequence[Any]]], *,
                 fold: Optional[Callable[[str], Any]] = None):
        self._options, self.fold = options, fold  # fold: normalise first (e.g. 'Monday' -> 'mon')

    @property
    def options(self) -> tuple[Any, ...]:
        return tuple(self._options() if callable(self._options) else self._options)

    @property
    def name(self) -> str:
        return "one of " + ", ".join(self.show(o) for o in self.options)

    def parse(self, v: Any) -> Any:
        folded = self.fold(v) if self.fold and isinstance(v, str) else v
        if isinstance(folded, bool) or folded not in self.options:
            raise ValueError(f"expected one of {', '.join(self.show(o) for o in self.options)}, got {v!r}")
        return folded


class Subset(Choice):
    """A list of names from a fixed set (checked whole: the problem names every unknown one)."""

    @property
    def name(self) -> str:
        return "list of " + ", ".join(self.show(o) for o in self.options)

    def parse(self, v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not v:
            raise ValueError(f"expected a list of at least one of {', '.join(self.options)}, got {v!r}")
        bad = [x for x in v if not isinstance(x, str) or x not in self.options]
        if bad:
            raise ValueError(f"unknown {bad}; known: {', '.join(self.options)}")
        return tuple(v)


class Url(Kind):
    name = "URL"

    def __init__(self, *, secret: bool = False, metrics: bool = False):
        self.secret, self.metrics = secret, metrics

    def parse(self, v: Any) -> str:
        url = check_url(v, self.secret)
        if self.metrics and urlsplit(url).path in ("", "/"):
            raise ValueError(f"the URL has no path: a scrape target is the metrics page itself, "
                             f"add /metrics (e.g. {url.rstrip('/')}/metrics)")
        return url

    def rules(self) -> str:
        if self.metrics:
            return "http(s), with the path of the metrics page (e.g. /metrics)"
        return "http(s), never shown in messages" if self.secret else "http(s)"


_MATCHER = re.compile(r"""\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"""
                      r"""("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)\s*""")


class Selector(Kind):
    """Extra PromQL label matchers: `name="value"` (=, !=, =~, !~) separated by commas; one pair of
    braces around the whole list and a trailing comma are allowed (the value read has neither)."""

    name = "PromQL matchers"

    def parse(self, v: Any) -> str:
        if not isinstance(v, str):
            raise ValueError(f"expected a string of PromQL label matchers, got {type_name(v)}")
        text = v.strip()
        inner = text[1:-1] if text.startswith("{") and text.endswith("}") else text
        pos = 0
        while pos < len(inner):
            m = _MATCHER.match(inner, pos)
            if m is None:
                raise ValueError(_selector_problem(inner, pos))
            pos = m.end()
            if pos < len(inner) and inner[pos] != ",":
                raise ValueError(_selector_problem(inner, pos, "a comma between two matchers"))
            pos += 1
        return inner.strip().rstrip(",").rstrip()  # the sources join it after their own matchers

    def rules(self) -> str:
        return 'PromQL label matchers, e.g. job="vllm",namespace=~"a|b"'


def _selector_problem(text: str, pos: int, expected: str = "") -> str:
    """What is wrong at `pos` of a matcher list, in words."""
    rest = text[pos:]
    if expected:
        hint = f"expected {expected}"
    elif "{" in rest or "}" in rest:
        hint = "braces must enclose the whole list (or leave them out)"
    elif re.match(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*[^\s\"'`]", rest):
        hint = "quote the value (job=\"vllm\", not job=vllm)"
    elif re.match(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*[\"'`]", rest):
        hint = "a quoted value is not closed"
    else:
        hint = "expected name=\"value\" (operators =, !=, =~, !~), matchers separated by commas"
    return (f"not a PromQL label-matcher list at character {pos + 1} ({rest[:30]!r}): {hint}; "
            f"e.g. job=\"vllm\",namespace=~\"a|b\"")


class ListenAddress(Kind):
    name = "HOST:PORT"

    def parse(self, v: Any) -> str:
        if isinstance(v, str):
            host, sep, port = v.rpartition(":")
            if sep and re.fullmatch(r"[0-9]{1,5}", port) and int(port) <= 65535 and not any(
                    c.isspace() or unicodedata.category(c) == "Cc" for c in host):
                return v
        raise ValueError(f"expected HOST:PORT or :PORT with a port from 0 to 65535, got {v!r}")


class Labels(Kind):
    name = "mapping of label names to strings"

    def parse(self, v: Any) -> dict[str, str]:
        if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            raise ValueError("expected a mapping of label names to string values")
        return dict(v)


class File(Text):
    name = "file path"

    def parse(self, v: Any) -> str:
        path = super().parse(v)
        if not os.path.isfile(path):
            raise ValueError(f"file not found: {path}")
        return path

    def rules(self) -> str:
        return "must exist"


class SecretFile(Text):
    """A file holding a secret: it must exist and hold one line (checked at load, never shown)."""

    name = "file path"

    def parse(self, v: Any) -> str:
        path = super().parse(v)
        if "/" not in path and not os.path.isfile(path):  # the secret itself, pasted in the wrong key?
            raise ValueError("no such file (the value is not shown: give the path of a file holding the secret)")
        read_secret_file(path)
        return path

    def rules(self) -> str:
        return "must exist; a secret: one line, no control characters"


class SecretEnv(Kind):
    """The name of an environment variable holding a secret: it must be set when the file is loaded."""

    name = "variable name"

    def parse(self, v: Any) -> str:
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("expected a variable name like HEADROOM_TOKEN (the value is not shown: "
                             "put the secret itself in a variable and name that)")
        read_secret_env(v)
        return v

    def rules(self) -> str:
        return "must be set; a secret: no control characters"


def damaged_store(path: str) -> bool:
    """Whether a file that does not start as SQLite does is sized as a SQLite file is (whole pages of
    512 bytes or a larger power of two): a store with a damaged header, not a file of another kind."""
    size = os.path.getsize(path)
    return size >= 512 and size % 512 == 0


class StorePath(Text):
    """A SQLite file: its directory must exist; an existing directory means DIR/`file_name`.
    A file that is not SQLite is refused, except with `damaged_ok` one sized in whole pages (a
    multiple of 512 bytes, as every SQLite file is): a store whose header was damaged, which its
    opener moves aside (kept) for a fresh one, rather than another file named by mistake."""

    name = "file path"

    def __init__(self, file_name: str, damaged_ok: bool = False):
        super().__init__()
        self.file_name = file_name
        self.damaged_ok = damaged_ok

    def parse(self, v: Any) -> str:
        path = super().parse(v)
        if os.path.isdir(path):
            path = os.path.join(path, self.file_name)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ValueError(f"directory does not exist: {parent}")
        if os.path.exists(path) and not os.path.isfile(path):
            raise ValueError(f"not a file: {path}")
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            try:
                with open(path, "rb") as f:
                    header = f.read(16)
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
            if header != b"SQLite format 3\x00" and not (self.damaged_ok and damaged_store(path)):
                raise ValueError(f"not a SQLite database: {path}")
        return path

    def rules(self) -> str:
        return f"its directory must exist; a directory means DIR/{self.file_name}"


class Timezone(Text):
    name = "time zone"

    def parse(self, v: Any) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415
        name = super().parse(v)
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(f"unknown time zone {name!r} (use an IANA name like Europe/Berlin)") from None
        return name


class Raw(Kind):
    """Anything: a key another command reads and validates (named in the help)."""

    def __init__(self, name: str = "any"):
        self._name = name

    @property
    def name(self) -> str:
        return self._name


class Mapping(Kind):
    """A mapping validated with the whole file by its owner (`section` documents its keys)."""

    name = "mapping"

    def __init__(self, section: Optional[Callable[[], type]] = None):
        self.section = section

    def parse(self, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ValueError(f"expected a mapping, got {type_name(v)}")
        return v

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return [(prefix, self.section(), "")] if self.section else []
