"""Simulated vLLM fleet, gateway, application and DCGM endpoints; workload; history generator.

See README.md in this folder. Main entry points (imported lazily):
``Fleet``, ``load_config``, ``config_from_dict``, ``theoretical_knee`` (fleet.py),
``start_fleet`` (server.py), ``generate_history``, ``write_openmetrics`` (history.py).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Fleet": "fleet", "load_config": "fleet", "config_from_dict": "fleet",
    "theoretical_knee": "fleet", "start_fleet": "server", "FleetHandle": "server",
    "generate_history": "history", "write_openmetrics": "history", "PoolParams": "engine",
}


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'headroom_lab.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


__all__ = sorted(_EXPORTS)
