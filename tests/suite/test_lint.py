"""The linter and the type checker, held by tests: `ruff check` over the repository and mypy over `monitor/`,
both configured in pyproject.toml ([tool.ruff], [tool.mypy]: the rules, the strict floors, the files
still waiting for their clean-up).

mypy runs in this process (`mypy.api.run`), so its check sits in the unit tier, where no subprocess may
start. ruff has no Python API (the package is its binary), so its check is `live`: the tier of tests that
run a binary (tests/tiers.py); it takes well under a second.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_type_error_in_monitor(monkeypatch):
    from mypy import api  # here, not at the top: the other tests never pay for loading mypy

    monkeypatch.chdir(ROOT)  # [tool.mypy] names files and its cache relative to the repository
    out, err, code = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-pretty",
                              "--show-error-codes"])
    assert code == 0, f"mypy (exit {code}):\n{out}{err}"


@pytest.mark.live
def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 0, f"ruff check (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
