"""Configuration: one YAML file, validated whole before anything starts.

Every key is declared once, in a typed section next to its owner (monitor/sources/settings.py,
monitor/capacity/settings.py, monitor/forecast/settings.py, monitor/digest/settings.py; the global
keys in monitor/config/headroom_yml.py): its kind (type and bounds), default and help. The reader
(monitor/kit/settings/reader.py) refuses what is not declared, and the first problem is one `ConfigError`,
`file: key: problem`: `headroom check-config` and `headroom run` give the same verdict because both
call `load()`. A flag that changes a key (`run --shard`, `once --interval`) is an `Override` given to
`load()`, never a `dataclasses.replace` on the frozen Config, so `Config.check` sees it too.
docs/configuration.md is generated from the declarations (`python -m monitor.config`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.capacity.settings import Capacity, PoolSettings
from monitor.forecast.settings import Forecast
from monitor.kit.settings.reader import ConfigError, Override, Reader, blame, read_yaml, with_overrides
from monitor.kit.settings.values import check_url, parse_duration
from monitor.sources.settings import EngineTarget, GatewaySource, HttpAuth, PrometheusSource, Target

from .headroom_yml import Config

__all__ = ["Capacity", "Config", "ConfigError", "EngineTarget", "Forecast", "GatewaySource", "HttpAuth", "PoolSettings",
           "Override", "PrometheusSource", "Target", "check_url", "from_dict", "load", "parse_duration"]


def from_dict(data: Any, file: str = "<config>", overrides: Sequence[Override] = ()) -> Config:
    """The whole file, validated: every section, every cross-section rule. `overrides` (the command
    line's `--shard`, `once --interval`) are written into the mapping first and read with the rest,
    so a value from a flag meets the same kinds, bounds and `Config.check` as one in the file, and
    a problem with it names the setting and the flag."""
    try:
        return Reader(file).section(Config, with_overrides(data, overrides), "", extra={"file": file})
    except ConfigError as exc:
        raise blame(exc, overrides) from None


def load(path: str, overrides: Sequence[Override] = ()) -> Config:
    return from_dict(read_yaml(path), path, overrides)
