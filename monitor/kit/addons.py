"""The parts another distribution adds to `headroom`, found through entry points, never by import.

headroom-lab (lab/: the simulated fleet, the load tester, the demo) sits on top of `monitor`; monitor
imports nothing of it. It registers:

    headroom.commands      name -> (module, one-line help) of a subcommand (`demo`, `sim`, ...)
    headroom.digest_demo   `demo` -> the module giving `headroom digest --demo` its simulated input

The group is read when a command line needs it (`headroom --help` reads only the small tuples, never a
command module). Without headroom-lab, its commands stop with one line naming what to install.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

log = logging.getLogger("monitor.kit.addons")

COMMANDS_GROUP = "headroom.commands"
DIGEST_DEMO_GROUP = "headroom.digest_demo"
LAB = "headroom-lab"
INSTALL = "pip install ./lab (or make demo)"
# the commands headroom-lab adds: named here only to say what to install when one is asked for
LAB_COMMANDS = ("demo", "sim", "loadtest", "compare")


class MissingAddOn(RuntimeError):
    """What was asked for comes with a distribution that is not installed."""


def missing(what: str) -> str:
    return f"{what} comes with {LAB}, which is not installed: {INSTALL}"


@dataclass(frozen=True)
class EntryPoint:
    name: str
    value: str  # module or module:attribute

    def load(self) -> object:
        module, _, attr = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _dist_name(folder: str) -> str:
    return re.sub(r"[-_.]+", "_", folder.rsplit(".", 1)[0].split("-", 1)[0]).lower()


def _entry_points(group: str) -> list[EntryPoint]:
    """The entry points of `group` of the distributions on sys.path (the first copy of a distribution
    wins), read from their `entry_points.txt` as importlib.metadata reads them, without importing it
    (that import alone is most of what `headroom --help` would cost)."""
    found: dict[str, EntryPoint] = {}
    seen: set[str] = set()
    for base in sys.path:
        try:
            names = sorted(n for n in os.listdir(base or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        for folder in names:
            dist = _dist_name(folder)
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(base or ".", folder, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            section = None
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section == group and "=" in line and not line.startswith(("#", ";")):
                    name, value = (x.strip() for x in line.split("=", 1))
                    found.setdefault(name, EntryPoint(name, value))
    return sorted(found.values(), key=lambda ep: ep.name)


@lru_cache(maxsize=None)
def commands() -> dict[str, tuple[str, str]]:
    """The subcommands the installed add-ons register: name -> (module, help). An entry point that
    does not load or is not a (module, help) pair is left out, with a warning naming it."""
    found: dict[str, tuple[str, str]] = {}
    for ep in _entry_points(COMMANDS_GROUP):
        try:
            value = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken add-on must not take the daemon's own commands down
            log.warning("entry point %s = %s (group %s) does not load: %s", ep.name, ep.value, COMMANDS_GROUP, exc)
            continue
        if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            log.warning("entry point %s = %s (group %s) is not a (module, help) pair", ep.name, ep.value,
                        COMMANDS_GROUP)
            continue
        found[ep.name] = value
    return found


def digest_demo() -> ModuleType:
    """The module of the simulated digest input (`demo_input`, `demo_settings`, `last_monday`)."""
    eps = [ep for ep in _entry_points(DIGEST_DEMO_GROUP) if ep.name == "demo"]
    if not eps:
        raise MissingAddOn(missing("--demo (a simulated history)"))
    return importlib.import_module(eps[0].value)


__all__ = ["commands", "digest_demo", "missing", "MissingAddOn", "LAB_COMMANDS", "INSTALL"]
