"""`headroom --help` starts in a blink: it imports no subcommand, so no pandas, statsmodels or
matplotlib (it took 2.3 s CPU when every subcommand was imported to list them). A subcommand imports
its own module only. Checked in a fresh interpreter, where nothing was imported before."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.live

PROBE = """
import contextlib, io, json, sys
from monitor.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main({argv!r})
    except SystemExit as exc:
        code = exc.code
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'statsmodels', 'matplotlib', 'numpy'))
commands = sorted(m for m in sys.modules if m.startswith('monitor.commands.'))
print(json.dumps({{"code": code, "heavy": heavy[:5], "commands": commands, "out": out.getvalue()}}))
"""


def probe(argv):
    r = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_help_imports_no_subcommand_and_no_numeric_stack():
    doc = probe(["--help"])
    assert doc["code"] == 0 and doc["heavy"] == [] and doc["commands"] == []
    for name in ("run", "once", "check-config", "digest", "loadtest", "plan", "backtest"):
        assert name in doc["out"]  # every subcommand is still listed with its help line


def test_a_subcommand_imports_its_own_module_only():
    doc = probe(["plan", "--help"])
    assert doc["code"] == 0 and doc["commands"] == ["monitor.commands.plan"]
    assert "--mix" in doc["out"]
