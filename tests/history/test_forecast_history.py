"""Prometheus-mode history for the forecasts: forecast_history over PrometheusHistory (monitor/history)
against a real Prometheus 2.42 backfilled with promtool."""
import math
import shutil
import time

import numpy as np
import pytest
import requests

from monitor.history.forecast_history import forecast_history
from monitor.history.query_range import PrometheusHistory, Query, bucket_query, default_queries, read_range
from monitor.model import schema

pytestmark = [pytest.mark.live, pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                reason="needs the prometheus and promtool binaries")]


class HTTPRangeClient:
    """The query_range contract of monitor.sources.prometheus, over the real HTTP API."""

    def __init__(self, base):
        self.base, self.calls = base, []

    def query_range(self, query, start, end, step):
        self.calls.append((start, end))
        r = requests.get(self.base + "/api/v1/query_range", timeout=10,
                         params={"query": query, "start": start, "end": end, "step": step})
        r.raise_for_status()
        return [(res["metric"], [(float(t), float(v)) for t, v in res["values"]])
                for res in r.json()["data"]["result"]]


@pytest.fixture(scope="module")
def prom(prometheus_on_history):
    end = math.floor(time.time() / 3600) * 3600 - 3600
    start = end - 3 * 3600
    ts = np.arange(start, end + 1, 60)
    body = []
    for i, t in enumerate(ts):
        body.append(f'headroom_active_requests{{pool="a"}} {i % 10} {t}')  # 0..9 every 10 min
        body.append(f'headroom_queued_requests{{pool="a"}} 1 {t}')
        body.append(f'headroom_active_requests{{pool="b"}} 3 {t}')
        body.append(f'headroom_queued_requests{{pool="b"}} 0 {t}')
        body.append(f'headroom_completion_rate{{pool="a"}} 2.5 {t}')
        body.append(f'headroom_task_arrival_rate{{pool="a",task_type="summarise"}} 0.5 {t}')
        body.append(f'headroom_task_arrival_rate{{pool="a",task_type="draft"}} 0.25 {t}')
        body.append(f'headroom_active_requests{{instance="x"}} 100 {t}')  # no pool: skipped
    # OpenMetrics wants each metric family's samples together
    body.sort(key=lambda s: s.split("{")[0])
    return prometheus_on_history("\n".join(body) + "\n# EOF\n").url, start, end


def test_fetch_history_maps_pools_series_and_task_types(prom):
    base, start, end = prom
    client = HTTPRangeClient(base)
    # the complete 5-minute buckets of [start + 600, end), each indexed by its start
    hist = forecast_history(PrometheusHistory(client), now=end, days=(end - start - 600) / 86400, step=300)
    assert set(hist) == {"a", "b"}
    assert set(hist["a"]) == {"arrival_rate", "load", "task_arrivals:summarise",
                              "task_arrivals:draft"}
    assert set(hist["b"]) == {"load"}
    act = hist["a"]["load"]
    # peak of active + queued over each 5-minute window: the cycle 0..9 peaks at 9 (+1 queued)
    assert act.max() == 10.0 and act.min() >= 5.0
    assert len(act) == (end - start - 600) // 300
    assert act.index[0] == start + 600 and act.index[-1] == end - 300
    assert (hist["b"]["load"] == 3.0).all()
    assert (hist["a"]["task_arrivals:summarise"] == 0.5).all()
    assert (hist["a"]["arrival_rate"] == 2.5).all()
    assert list(act.index) == sorted(act.index)


def test_long_ranges_are_split_into_chunks_without_losing_points(prom):
    base, start, end = prom
    query = 'sum by (pool) (headroom_active_requests)'
    whole = {lab.get("pool"): pts for lab, pts in read_range(HTTPRangeClient(base), query, start, end, 60)}
    client = HTTPRangeClient(base)
    chunked = {lab.get("pool"): pts for lab, pts in read_range(client, query, start, end, 60, max_points=50)}
    assert len(client.calls) == math.ceil(((end - start) // 60 + 1) / 50)
    assert chunked["a"] == whole["a"]
    assert len(whole["a"]) == (end - start) // 60 + 1


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="step"):
        PrometheusHistory(None).load(None, 0, 10, step=0)
    with pytest.raises(ValueError, match="before start"):
        PrometheusHistory(None).load(None, 10, 0, step=60)
    with pytest.raises(ValueError, match="unknown history series 'latency'"):
        PrometheusHistory(None, queries={"latency": [Query("up")]})
    load = default_queries()["load"][0].expr
    assert bucket_query(load, schema.SERIES["load"].agg, 60, 60).startswith("max_over_time")
