"""benchmarks/budget_daemon.py `seed`: the history a benchmark's headroom daemon is given before its
first refit (the figures are benchmarks/priority_protection.py's). Exact: `days` of `load` readings
every `interval` seconds, all before the warm-up, each one of the warm-up's own readings; the
warm-up's readings and other series untouched."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

from budget_daemon import seed

from monitor.history.store import HistoryStore

SINCE, UNTIL = 1_800_000_000.0, 1_800_000_120.0


def _warmup(path: str) -> None:
    live = [("tiny", "load", SINCE + 5 * i, float(i % 3 == 0)) for i in range(24)]
    with HistoryStore(path) as store:
        store.append(live + [("tiny", "kv_tokens", SINCE, 7.0), ("other", "load", SINCE - 60, 9.0)])


def test_seed_writes_days_of_the_warmups_own_readings_before_it(tmp_path):
    path = str(tmp_path / "history.sqlite")
    _warmup(path)
    got = seed(path, "tiny", SINCE, UNTIL, days=0.5, interval=5)
    with HistoryStore(path) as store:
        past = store.query("tiny", "load", SINCE - 86400, SINCE - 1)
        live = store.query("tiny", "load", SINCE, UNTIL)
        assert store.count("tiny", "kv_tokens") == 1 and store.count("other", "load") == 1
    assert len(past) == got["points"] == 0.5 * 86400 / 5
    assert past.index.min() == SINCE - 0.5 * 86400 and past.index.max() == SINCE - 5
    assert set(past.unique()) == {0.0, 1.0}  # drawn from the warm-up's readings only (both drawn)
    assert len(live) == 24 and got["warmup_load_readings"] == {"0.0": 16, "1.0": 8}


def test_seed_refuses_a_warmup_without_readings(tmp_path):
    path = str(tmp_path / "history.sqlite")
    _warmup(path)
    with pytest.raises(RuntimeError, match="only 0 load readings of pool 'nope'"):
        seed(path, "nope", SINCE, UNTIL, days=1)
