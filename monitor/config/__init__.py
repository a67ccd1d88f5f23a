"""Configuration: one YAML file, validated whole before anything starts.

Every key is declared once, in a typed section next to its owner (monitor/sources/settings.py,
monitor/capacity/settings.py, monitor/forecast/settings.py, monitor/digest/settings.py; the global
keys in monitor/config/headroom_yml.py): its kind (type and bounds), default and help. The reader
(monitor/kit/settings/reader.py) refuses what is not declared, and the first problem is one `ConfigError`,
`file: key: problem`: `headroom check-config` and `headroom run` give the same verdict because both
call `load()`. docs/configuration.md is generated from the declarations (`python -m monitor.config`).
"""
from __future__ import annotations

from typing import Any

from monitor.capacity.settings import Capacity, PoolSettings
from monitor.forecast.settings import Forecast
from monitor.kit.settings.reader import ConfigError, Reader, read_yaml
from monitor.kit.settings.values import check_url, parse_duration
from monitor.sources.settings import EngineTarget, GatewaySource, HttpAuth, PrometheusSource, Target

from .headroom_yml import Config

__all__ = ["Capacity", "Config", "ConfigError", "EngineTarget", "Forecast", "GatewaySource", "HttpAuth", "PoolSettings",
           "PrometheusSource", "Target", "check_url", "from_dict", "load", "parse_duration"]


def from_dict(data: Any, file: str = "<config>") -> Config:
    """The whole file, validated: every section, every cross-section rule."""
    return Reader(file).section(Config, data, "", extra={"file": file})


def load(path: str) -> Config:
    return from_dict(read_yaml(path), path)
