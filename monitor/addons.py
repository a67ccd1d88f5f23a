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
from functools import lru_cache
from types import ModuleType

log = logging.getLogger("monitor.addons")

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


def _entry_points(group: str):
    from importlib.metadata import entry_points  # noqa: PLC0415
    return sorted(entry_points(group=group), key=lambda ep: ep.name)


@lru_cache(maxsize=None)
def commands() -> dict[str, tuple[str, str]]:
    """The subcommands the installed add-ons register: name -> (module, help). An entry point that
    does not load or is not a (module, help) pair is left out, with a warning naming it."""
    found: dict[str, tuple[str, str]] = {}
    for ep in _entry_points(COMMANDS_GROUP):
        try:
            value = ep.load()
        except Exception as exc:  # a broken add-on must not take the daemon's own commands down
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
