"""The command line starts in a blink: `--help`, `check-config` (a store configured, as in production)
and `once`, `run`, `digest` and `backtest --help` import none of the numeric stack (pandas, numpy,
statsmodels, matplotlib); a subcommand imports what it needs when it runs. Timings are a benchmark (benchmarks/cli_start_bench.py);
what is imported is exact, read from Python's own `-X importtime` list."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"pandas", "numpy", "statsmodels", "matplotlib", "scipy"}


def _imported(args: list[str], cwd: Path) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "monitor", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["check-config", "headroom.yml"], ["once", "--help"],
                                  ["run", "--help"], ["digest", "--help"], ["backtest", "--help"]])
def test_no_numeric_stack_before_the_work(tmp_path, args):
    (tmp_path / "headroom.yml").write_text(
        "sources:\n  vllm:\n    targets: [\"http://127.0.0.1:9/metrics\"]\n"
        f"store:\n  path: {tmp_path / 'history.sqlite'}\n")
    modules = _imported(args, tmp_path)
    assert "monitor" in modules  # the list is read (the check could fail)
    assert not {m for m in modules if m.split(".")[0] in HEAVY}, sorted(m for m in modules if m.split(".")[0] in HEAVY)[:5]
