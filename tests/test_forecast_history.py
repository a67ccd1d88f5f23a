"""Prometheus-mode history for the forecasts: forecast_history over PrometheusHistory (monitor/history)
against a real Prometheus 2.42 backfilled with promtool."""
import math
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest
import requests

from monitor import schema
from monitor.history.forecasts import forecast_history
from monitor.history.prometheus import PrometheusHistory, Query, bucket_query, default_queries, read_range
from monitor.kit.process import stop_process

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
def prom(tmp_path_factory):
    d = tmp_path_factory.mktemp("prom")
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
    (d / "h.om").write_text("\n".join(body) + "\n# EOF\n")
    data = d / "data"
    data.mkdir()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(d / "h.om"),
                    str(data)], check=True, capture_output=True)
    (d / "p.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'p.yml'}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if requests.get(base + "/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        yield base, start, end
    finally:
        stop_process(proc)


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
