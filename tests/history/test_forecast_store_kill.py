"""kill -9 the writer repeatedly: every point it reported committed is present exactly once."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from monitor.history.store import HistoryStore

WRITER = textwrap.dedent("""
    import sys
    from monitor.history.store import HistoryStore
    path, start = sys.argv[1], int(sys.argv[2])
    st = HistoryStore(path, retention_seconds=None, downsample_after_seconds=None)
    i = start
    while True:
        # re-append the previous batch too (a restarted writer repeating itself must not duplicate)
        batch = [("pool", "s", float(t), float(t) * 0.5) for t in range(max(0, i - 3), i + 3)]
        st.append(batch)
        print(i + 2, flush=True)   # every t <= i + 2 is committed
        i += 3
""")

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def test_kill_minus_nine_never_loses_or_duplicates(tmp_path):
    path = str(tmp_path / "kill.db")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    committed = -1
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, path, str(committed + 1)],
                                stdout=subprocess.PIPE, text=True, env=env)
        seen = 0
        target = 20 + 15 * round_
        for line in proc.stdout:
            committed = max(committed, int(line))
            seen += 1
            if seen >= target:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
    with HistoryStore(path, retention_seconds=None, downsample_after_seconds=None) as st:
        s = st.query("pool", "s", 0, 1e9)
        import sqlite3
        db = sqlite3.connect(path)
        dup = db.execute("SELECT ts, COUNT(*) FROM points GROUP BY pool, series, ts HAVING COUNT(*) > 1").fetchall()
    assert dup == []
    assert committed > 100
    # every reported point is present with its value; the writer may have committed a little more
    for t in range(committed + 1):
        assert s.loc[float(t)] == t * 0.5
    assert len(s) >= committed + 1
    assert list(s.index) == [float(t) for t in range(len(s))]  # no holes
