"""Copies of headroom that disagree (two HA replicas of the daemon and a Prometheus-mode daemon, all
exporting pool chat's knee into one Prometheus): `headroom plan` and the digest take the pessimistic
copy's knee, say which copy it came from, and keep a copy's prior a prior. A real Prometheus,
backfilled with promtool, answers the queries (the PromQL of the per-copy join is what is tested)."""
from __future__ import annotations

import shutil
import time

import pytest

from monitor.digest.knee_report import KneeReading, knees_from_prometheus
from monitor.sources.prometheus import PrometheusClient

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                 reason="needs prometheus and promtool")]

STEP, N = 15, 121  # half an hour of samples every 15 s
# (target labels, knee requests for the pool, replicas, knee source): 17 replicas' worth of knee
# on one copy, 5 on another, as the journey saw; the last copy (Prometheus mode) learned a low knee
COPIES = [
    ('job="headroom",instance="ha-0:9880"', 52.0, 8, "learned"),   # 6.5 per replica
    ('job="headroom",instance="ha-1:9880"', 48.0, 8, "prior"),     # 6.0 per replica: a prior
    ('job="headroom-prom",instance="pm:9880"', 13.2, 8, "learned"),  # 1.65 per replica: the lowest
]


def _openmetrics(end: float, copies) -> str:
    lines = []
    start = end - STEP * (N - 1)
    for name in ("headroom_knee_requests", "headroom_replicas", "headroom_knee_info"):
        lines.append(f"# TYPE {name} gauge")
        for labels, knee, reps, source in copies:
            value = {"headroom_knee_requests": knee, "headroom_replicas": reps, "headroom_knee_info": 1}[name]
            extra = f',source="{source}",signal="queue"' if name == "headroom_knee_info" else ""
            for i in range(N):
                lines.append(f'{name}{{pool="chat",{labels}{extra}}} {value} {start + i * STEP:.0f}')
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prom(prometheus_on_history):
    end = float(int(time.time()) // 60 * 60 - 3 * 3600)  # three hours back, inside retention
    return prometheus_on_history(_openmetrics(end, COPIES)), end


def test_the_digest_takes_the_pessimistic_copy(prom):
    p, end = prom
    client = PrometheusClient(p.url)
    try:
        got = knees_from_prometheus(client, end - 1800, end, 60.0)
    finally:
        client.close()
    assert got == {"chat": KneeReading(1.65, "learned", pytest.approx(end, abs=60), replicas=8,
                                       copy='job="headroom-prom", instance="pm:9880"', copies=3)}


def test_the_digest_names_a_prior_a_prior(prom):
    """Only the ha-1 copy's prior is lower than the learned knee of the other copy: it is a prior."""
    p, end = prom
    client = PrometheusClient(p.url)
    try:
        got = knees_from_prometheus(client, end - 1800, end, 60.0, selector='job="headroom"')
    finally:
        client.close()
    assert got["chat"].per_replica == pytest.approx(6.0) and got["chat"].source == "prior"
    assert got["chat"].copy == 'job="headroom", instance="ha-1:9880"' and got["chat"].copies == 2


def test_plan_takes_the_pessimistic_copy_and_says_which(prom):
    """`plan --pool chat` reads the knee through read_pool (test_capacity_plan runs the command line)."""
    from monitor.commands import plan as plan_cmd
    p, end = prom
    measured, notes = plan_cmd.read_pool(plan_cmd._query_fn(p.url, end), "chat")
    assert measured == {"knee_requests_per_replica": pytest.approx(1.65), "replicas": 8}
    assert len(notes) == 1 and 'the copy job="headroom-prom", instance="pm:9880"' in notes[0]
    assert "(learned)" in notes[0] and "the lowest of 3 copies" in notes[0]
    assert 'instance="ha-0:9880": 6.50' in notes[0] and 'instance="ha-1:9880": 6.00' in notes[0]
