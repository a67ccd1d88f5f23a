"""The layering, held by a test: the pure modules import no I/O library and read no clock.

Pure = the derive and capacity layers, the cycle's pure step, the forecast models and backtests and
the history schema (docs/architecture.md). They take plain data and are handed `now`; sockets,
HTTP, SQLite, schedulers, subprocesses and the clock belong to sources/, pipeline/, the stores, the
scheduler and the commands.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

MONITOR = Path(__file__).resolve().parents[2] / "monitor"
PURE = sorted([*MONITOR.glob("derive/*.py"), *MONITOR.glob("capacity/*.py"),
               *MONITOR.glob("step/*.py"), MONITOR / "model" / "schema.py",
               *[MONITOR / "forecast" / f for f in ("models.py", "model_base.py", "naive.py", "statsmodels_models.py",
                                                   "rolling_origin.py", "scores.py", "selection.py", "series.py", "pool.py",
                                                   "calendar.py")]])
FORBIDDEN_IMPORTS = {"sqlite3", "socket", "http", "urllib", "requests", "apscheduler", "subprocess",
                     "multiprocessing", "threading", "ssl", "selectors"}
# a stopwatch (time.perf_counter / process_time, as rolling_origin.py reports what a fit cost) times the
# work and dates nothing; the clocks below date it, or wait
CLOCKS = {("time", "time"), ("time", "monotonic"), ("time", "sleep"), ("time", "time_ns"),
          ("datetime", "now"), ("datetime", "utcnow"), ("date", "today"), ("pd.Timestamp", "now")}


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        else:
            names = []
        for name in names:
            if name.split(".")[0] in FORBIDDEN_IMPORTS and name != "urllib.parse":  # parse: strings only
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if (owner.split(".")[-1], node.func.attr) in CLOCKS or (owner, node.func.attr) in CLOCKS:
                found.append(f"line {node.lineno}: reads the clock ({owner}.{node.func.attr}())")
    return sorted(found, key=lambda v: int(v.split(':')[0].split()[1]))


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(MONITOR)))
def test_pure_module_does_no_io_and_reads_no_clock(path):
    assert _violations(path) == []


def test_the_checker_catches_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nimport requests\nfrom sqlite3 import connect\nx = time.time()\n"
                   "import urllib.request\nfrom datetime import datetime\ny = datetime.now()\n")
    lines = sorted(int(v.split(":")[0].split()[1]) for v in _violations(bad))
    assert lines == [2, 3, 4, 5, 7]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_no_process_is_started_inside_the_forecast_package():
    """Fits are time-boxed through the runner the application injects (monitor/kit/timebox.py), not by a
    fork hidden in the forecast package."""
    offenders = {str(p.relative_to(MONITOR)): sorted(i for i in _imports(p)
                                                     if i.split(".")[0] in ("multiprocessing", "subprocess")
                                                     or i.endswith("timebox"))
                 for p in MONITOR.glob("forecast/*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_application_is_built_in_one_place():
    """monitor/app builds the daemon; no other module holds a scheduler or the hook lists."""
    holders = []
    for p in MONITOR.rglob("*.py"):
        if p.parent == MONITOR / "app":
            continue
        text = p.read_text(encoding="utf-8")
        if "BackgroundScheduler(" in text or "extra_jobs" in text or "on_stop" in text:
            holders.append(str(p.relative_to(MONITOR)))
    assert holders == []
    assert not (MONITOR / "wiring.py").exists()

