"""The one reader of headroom's YAML files: typed sections whose keys declare their kind (type and
bounds), default and help text in one place (krr's typed strategy settings are the model).

A section is a dataclass whose settings are declared with `key()`:

    @dataclass(frozen=True)
    class Forecast:
        refit_minutes: float = key(Number(gt=0, le=10080), 15.0, help="refit the forecasts every N minutes")

`Reader(file).section(Forecast, mapping, "forecast")` refuses any key the section does not declare,
reads each declared key with its kind and returns the dataclass. The first problem raises one
`ConfigError` whose text is `file: key.path: problem`. The same declarations generate
docs/configuration.md (monitor/config/docs.py), so the reference cannot drift from the reader.

What a section may add to its keys:
  `shorthand(value) -> dict`  (staticmethod) a scalar form, e.g. a target given as its URL only;
  `check(self, reader, key)`  rules across keys; returns a replaced section, or None to keep it;
  `REMOVED = {key: problem}`  keys no longer accepted, each refused with its own problem.
A `key(..., path="basic_auth.username")` lives in a nested mapping; `group(Cls, path=...)` reads the
keys of another section from the same mapping (the credentials next to a source's url).

A command-line flag that stands for a key (`--shard` for `global.shard`) is an `Override`: written into
the mapping by `with_overrides` before the reader reads it, so the flag's value meets the same kinds
and checks as the file's; `blame` adds the flag to an error about it.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Optional

import yaml

from monitor.kit.settings.values import type_name


class ConfigError(ValueError):
    """A bad configuration: `file: key: problem`, the key a dotted path (empty for the whole file)."""

    def __init__(self, file: str, key: str, problem: str):
        super().__init__(f"{file}: {key}: {problem}" if key else f"{file}: {problem}")
        self.file, self.key, self.problem = file, key, problem


@dataclass(frozen=True)
class Spec:
    """One setting: what it holds (`kind`: type and bounds), where it lives and what it is for."""

    kind: Any
    help: str
    path: Optional[str] = None  # relative to the section's mapping; None: the field's own name
    required: bool = False
    merge: bool = False  # a group: the keys of section `kind.cls`, read from the mapping at `path`


def key(kind: Any, default: Any = None, *, help: str, path: Optional[str] = None, required: bool = False) -> Any:
    """Declare one setting as a dataclass field: kind, default and help in one place."""
    meta = {"spec": Spec(kind, help, path, required)}
    if getattr(type(default), "__hash__", None) is None:  # lists, dicts, mutable sections
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@lru_cache(maxsize=None)
def specs(cls: type) -> tuple[tuple[str, Spec, str], ...]:
    """(field name, spec, path) of every declared setting of a section, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("spec")
        if spec is not None:
            out.append((f.name, spec, f.name if spec.path is None else spec.path))
    return tuple(out)


def default_of(cls: type, name: str) -> Any:
    """The declared default of one setting (what the docs print)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


@lru_cache(maxsize=None)
def key_tree(cls: type) -> dict[str, Any]:
    """Nested dict of the keys a section accepts: name -> None (a setting) or a dict (a mapping)."""
    tree: dict[str, Any] = {}
    for _, spec, path in specs(cls):
        parts = path.split(".") if path else []
        node = tree
        for part in parts[:-1] if not spec.merge else parts:
            node = node.setdefault(part, {})
        if spec.merge:
            _merge(node, key_tree(spec.kind.cls))
        else:
            node.setdefault(parts[-1], None)
    return tree


def _merge(into: dict[str, Any], tree: dict[str, Any]) -> None:
    for k, v in tree.items():
        if isinstance(v, dict):
            _merge(into.setdefault(k, {}), v)
        else:
            into.setdefault(k, None)


def join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else (prefix or path)


class Reader:
    """Reads sections of one file; every problem is `error(file, key, problem)`."""

    def __init__(self, file: str, error: type[ConfigError] = ConfigError):
        self.file, self.error = file, error

    def fail(self, key: str, problem: str) -> ConfigError:
        return self.error(self.file, key, problem)

    def section(self, cls: type, value: Any, key: str, *, extra: Optional[dict[str, Any]] = None,
                closed: bool = True) -> Any:
        if value is None:
            value = {}
        short = not isinstance(value, dict)
        if short:
            shorthand = getattr(cls, "shorthand", None)
            if shorthand is None:
                raise self.fail(key, f"expected a mapping, got {type_name(value)}")
            try:
                value = shorthand(value)
            except (ValueError, TypeError) as exc:
                raise self.fail(key, str(exc)) from None
        if closed:
            self._closed(value, key_tree(cls), key, getattr(cls, "REMOVED", {}))
        try:
            obj = cls(**self._settings(cls, value, key, extra))
        except self.error as exc:  # a shorthand's problem belongs to the value the user wrote
            if short and exc.key.startswith(f"{key}."):
                raise self.fail(key, exc.problem) from None
            raise
        check = getattr(obj, "check", None)
        return (check(self, key) or obj) if check else obj

    def _settings(self, cls: type, value: dict[str, Any], key: str, extra: Optional[dict[str, Any]]) -> dict[str, Any]:
        kwargs = dict(extra or {})
        for name, spec, path in specs(cls):
            where = join(key, path)
            v = _lookup(value, path)
            if spec.merge:
                kwargs[name] = self.section(spec.kind.cls, v, where, closed=False)
            elif v is None:
                if spec.required:
                    raise self.fail(where, "required")
            else:
                kwargs[name] = spec.kind.read(self, v, where)
        return kwargs

    def _closed(self, value: dict[str, Any], tree: dict[str, Any], key: str, removed: dict[str, str]) -> None:
        for k, v in value.items():
            where = join(key, str(k))
            if k in removed:
                raise self.fail(where, removed[k])
            if k not in tree:
                raise self.fail(where, unknown_key(str(k), tree))
            sub = tree[k]
            if isinstance(sub, dict) and v is not None:
                if not isinstance(v, dict):
                    raise self.fail(where, f"expected a mapping, got {type_name(v)}")
                self._closed(v, sub, where, {})


def unknown_key(name: str, allowed: Iterable[str]) -> str:
    names = sorted(allowed)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown key ({hint}allowed: {', '.join(names)})"


def _lookup(value: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


@dataclass(frozen=True)
class Override:
    """One setting given on the command line instead of in the file: `key` is its dotted path in the
    file (`global.shard`), `value` what the file would hold there, `flag` what was typed (`--shard 1/2`),
    named beside any problem with the value."""

    key: str
    value: Any
    flag: str

    def covers(self, where: str) -> bool:
        """Whether a problem at `where` (a reader's key) is one with this override's value."""
        return where == self.key or where.startswith((f"{self.key}.", f"{self.key}["))


def with_overrides(data: Any, overrides: Sequence[Override]) -> Any:
    """A copy of a file's mapping with each override written at its key, for the reader to read like
    the rest (the file's own mapping is not changed). A file, or a mapping on the way to a key, that
    is no mapping is left as the file wrote it, for the reader to refuse naming what is wrong."""
    if not overrides:
        return data
    out = {} if data is None else copy.deepcopy(data)
    for o in overrides:
        node, parts = out, o.key.split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict):
                break
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        if isinstance(node, dict):
            node[parts[-1]] = o.value
    return out


def blame(exc: ConfigError, overrides: Sequence[Override]) -> ConfigError:
    """The reader's error, naming the flag when the value at fault came from the command line."""
    o = next((o for o in overrides if o.covers(exc.key)), None)
    if o is None:
        return exc
    return type(exc)(exc.file, exc.key, f"{exc.problem} (given as {o.flag})")


def read_yaml(path: str, error: type[ConfigError] = ConfigError) -> Any:
    """The parsed YAML of a file; any problem reading or parsing it is one `error(path, "", problem)`."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise error(path, "", "file not found") from None
    except OSError as exc:
        raise error(path, "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise error(path, "", "not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader (below)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise error(path, "", f"not valid YAML: {where}{getattr(exc, 'problem', None) or exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. a date like 2024-13-01, or nesting too deep
        raise error(path, "", f"not valid YAML: {type(exc).__name__}: {exc}") from None


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader, except that a scalar shaped like a date that is no date (2026-02-30) stays the
    string it is: the key's own kind then refuses it naming the key (`file: key: problem`), instead
    of the whole file failing as invalid YAML."""


def _timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_timestamp(loader, node)
    except (ValueError, OverflowError):
        return loader.construct_scalar(node)


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)
