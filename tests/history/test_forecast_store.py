"""HistoryStore: idempotent appends, range queries with step aggregation, reopen, retention,
downsampling, bad input."""
import math
import sqlite3

import pytest

from monitor.history.store import HistoryStore, StoreError

DAY = 86400.0


def test_append_query_and_idempotent(tmp_path):
    path = str(tmp_path / "h.db")
    with HistoryStore(path) as st:
        pts = [("pool-a", "active_requests", 1000.0 + 60 * i, float(i)) for i in range(10)]
        assert st.append(pts) == 10
        assert st.append(pts[:5]) == 5  # appended again: no duplicates
        assert st.append([("pool-a", "active_requests", 1000.0, 42.0)]) == 1  # last write wins
        s = st.query("pool-a", "active_requests", 0, 10_000)
        assert list(s.index) == [1000.0 + 60 * i for i in range(10)]
        assert s.iloc[0] == 42.0 and s.iloc[9] == 9.0
        assert st.count("pool-a", "active_requests") == 10
        assert st.count("pool-b") == 0
        assert st.query("pool-b", "active_requests", 0, 10_000).empty


def test_step_aggregation_max_and_mean(tmp_path):
    with HistoryStore(str(tmp_path / "h.db")) as st:
        st.append([("p", "s", 60.0 * i, float(v)) for i, v in enumerate([1, 5, 3, 2, 8, 2])])
        mx = st.query("p", "s", 0, 1e6, step=180, agg="max")
        mean = st.query("p", "s", 0, 1e6, step=180, agg="mean")
        assert list(mx.index) == [0.0, 180.0]
        assert list(mx.values) == [5.0, 8.0]
        assert mean.values == pytest.approx([3.0, 4.0])


def test_reopen_after_close_keeps_points_and_uses_wal(tmp_path):
    path = str(tmp_path / "h.db")
    st = HistoryStore(path)
    st.append([("p", "s", float(t), t * 2.0) for t in range(100)])
    st.close()
    with pytest.raises(StoreError, match="closed"):
        st.append([("p", "s", 1.0, 1.0)])
    st2 = HistoryStore(path)
    s = st2.query("p", "s", 0, 1000)
    assert len(s) == 100 and s.loc[99.0] == 198.0
    st2.close()
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_retention_deletes_old_points(tmp_path):
    with HistoryStore(str(tmp_path / "h.db"), retention_seconds=2 * DAY,
                      downsample_after_seconds=None) as st:
        now = 10 * DAY
        st.append([("p", "s", now - k * DAY, float(k)) for k in range(5)])
        assert st.apply_retention(now) == 2  # 3 and 4 days old
        s = st.query("p", "s", 0, now)
        assert sorted(s.values) == [0.0, 1.0, 2.0]


def test_downsampling_keeps_max_and_mean_exact(tmp_path):
    path = str(tmp_path / "h.db")
    with HistoryStore(path, retention_seconds=None, downsample_after_seconds=DAY,
                      downsample_step_seconds=3600) as st:
        now = 5 * DAY
        old = [("p", "s", 3600.0 * 10 + 60 * i, float(i % 7)) for i in range(60)]  # one old hour
        new = [("p", "s", now - 600 + 60 * i, 1.0) for i in range(10)]
        st.append(old + new)
        before_max = st.query("p", "s", 0, now, step=3600, agg="max")
        before_mean = st.query("p", "s", 0, now, step=3600, agg="mean")
        assert st.downsample(now) == 60
        assert st.count("p", "s") == 1 + 10  # one rollup row + the recent raw points
        after_max = st.query("p", "s", 0, now, step=3600, agg="max")
        after_mean = st.query("p", "s", 0, now, step=3600, agg="mean")
        assert after_max.to_dict() == before_max.to_dict()
        assert after_mean.values == pytest.approx(before_mean.values)
        # a second pass folds nothing and changes nothing
        assert st.downsample(now) == 0
        assert st.query("p", "s", 0, now, step=3600, agg="mean").values == pytest.approx(before_mean.values)
    with HistoryStore(path, retention_seconds=None, downsample_after_seconds=DAY) as st:
        assert st.count("p", "s") == 11  # downsampled state persisted


@pytest.mark.parametrize("point, message", [
    (("", "s", 1.0, 1.0), "pool"),
    (("p", "", 1.0, 1.0), "series"),
    (("p", "s", "x", 1.0), "numbers"),
    (("p", "s", 1.0, math.nan), "not finite"),
    (("p", "s", math.inf, 1.0), "timestamp"),
    (("p", "s", 1.0), "expected"),
])
def test_bad_points_are_rejected_with_the_field_named(tmp_path, point, message):
    with HistoryStore(str(tmp_path / "h.db")) as st:
        with pytest.raises(StoreError, match=message):
            st.append([("p", "s", 0.0, 1.0), point])
        assert st.count() == 0  # nothing of the rejected batch was written


def test_bad_settings_and_queries(tmp_path):
    with pytest.raises(StoreError, match="retention"):
        HistoryStore(str(tmp_path / "h.db"), retention_seconds=0)
    with pytest.raises(StoreError, match="does not exist"):
        HistoryStore(str(tmp_path / "missing" / "h.db"))
    with HistoryStore(str(tmp_path / "h.db")) as st:
        with pytest.raises(StoreError, match="agg"):
            st.query("p", "s", 0, 1, agg="median")
        with pytest.raises(StoreError, match="before start"):
            st.query("p", "s", 10, 1)


def test_a_schema_1_store_is_upgraded_to_the_history_schema(tmp_path):
    """Schema 1 kept active + queued under `active_requests`; opening it moves to schema 2: active
    alone, the sum as `load`, queued untouched (monitor/model/schema.py), in one transaction."""
    import sqlite3

    path = str(tmp_path / "h.sqlite")
    with HistoryStore(path) as s:
        s.append([("p", "active_requests", 1000.0, 10.0), ("p", "queued_requests", 1000.0, 3.0),
                  ("p", "active_requests", 1300.0, 4.0)])  # no queue recorded at 1300
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with HistoryStore(path) as s:
        def points(series):
            return {float(t): float(v) for t, v in s.query("p", series, 0, 2000, step=1, agg="max").items()}
        assert points("active_requests") == {1000.0: 7.0, 1300.0: 4.0}
        assert points("load") == {1000.0: 10.0, 1300.0: 4.0}
        assert points("queued_requests") == {1000.0: 3.0}
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)
    db.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema '9' is newer"):
        HistoryStore(path)
