"""tests/run_tiers.py: which tiers run as several pytest processes, and when one process instead."""
from __future__ import annotations

import importlib.util
import pathlib

HERE = pathlib.Path(__file__).resolve().parents[1]


def _run_tiers():
    spec = importlib.util.spec_from_file_location("run_tiers", HERE / "run_tiers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_unit_and_live_tiers_run_in_several_processes_unless_named_tests_or_the_cache_say_one():
    rt = _run_tiers()
    for tier in ("unit", "live"):
        assert rt.command(tier, [])[1].endswith("parallel.py")
        assert rt.command(tier, ["-x"])[1].endswith("parallel.py")
        for args in (["--lf"], ["--ff", "-x"], ["--last-failed-no-failures=none"], ["--sw"],
                     ["tests/core/test_derive.py"]):
            cmd = rt.command(tier, args)
            assert cmd[1:3] == ["-m", "pytest"] and cmd[-len(args):] == args, (tier, args, cmd)
