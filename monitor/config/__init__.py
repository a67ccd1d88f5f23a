"""Configuration: one YAML file, validated whole before anything starts.

Every key is declared once, in a typed section (monitor/config/headroom.py; the digest's in
monitor/digest/settings.py): its kind (type and bounds), default and help. The reader
(monitor/config/reader.py) refuses what is not declared, and the first problem is one `ConfigError`,
`file: key: problem`: `headroom check-config` and `headroom run` give the same verdict because both
call `load()`. docs/configuration.md is generated from the declarations (`python -m monitor.config`).
"""
from __future__ import annotations

from typing import Any

from .headroom import (Capacity, Config, EngineTarget, Forecast, GatewaySource, HttpAuth, PoolSettings,
                       PrometheusSource, Target)
from .reader import ConfigError, Reader, read_yaml
from .values import check_url, parse_duration

__all__ = ["Capacity", "Config", "ConfigError", "EngineTarget", "Forecast", "GatewaySource", "HttpAuth", "PoolSettings",
           "PrometheusSource", "Target", "check_url", "from_dict", "load", "parse_duration"]


def from_dict(data: Any, file: str = "<config>") -> Config:
    """The whole file, validated: every section, every cross-section rule."""
    return Reader(file).section(Config, data, "", extra={"file": file})


def load(path: str) -> Config:
    return from_dict(read_yaml(path), path)
