"""Label values are data end to end (issue 38, Build 1): a lone surrogate from a JSON answer (the
query layer's labels, an alert's text) is replaced with U+FFFD where it comes in and counted
(`headroom_input_anomalies_total{kind="invalid_text"}`); the body, the page and the JSON stay UTF-8."""
from __future__ import annotations

import json

from monitor.derive.core import derive_pools
from monitor.export.collector import Exposition
from monitor.export.landing import Trends, render
from monitor.export.snapshot_json import snapshot_to_dict
from monitor.kit.text import valid_text
from monitor.model import Alert, ReplicaReading, Snapshot, SourceStatus
from monitor.pipeline.cycle import valid_inputs
from monitor.step.cycle_state import CycleInputs


def test_valid_text_replaces_lone_surrogates_only():
    assert valid_text("a\ud800b") == "a\ufffdb"
    assert valid_text("\udfff") == "\ufffd"
    assert valid_text("\ud83d\ude00") == "\U0001F600"  # a pair that makes one character is joined
    ordinary = "é/日本語"
    assert valid_text(ordinary) is ordinary


def hostile_inputs() -> CycleInputs:
    r = ReplicaReading(target="inst\ud800", model="m\ud800", timestamp=100.0, labels={"cluster": "\udc00"},
                       running=2.0, waiting=0.0)
    plain = ReplicaReading(target="ok", model="tiny", timestamp=100.0, running=1.0, waiting=0.0)
    alert = Alert(name="HeadroomLow", state="firing", pool="m\ud800", summary="low \ud800",
                  labels={"pool": "m\ud800"})
    return CycleInputs([r, plain], [SourceStatus(source="prometheus", target="x", up=False, detail="bad \ud800")],
                       alerts=[alert])


def test_valid_inputs_replaces_and_counts_each_text():
    inputs = hostile_inputs()
    plain = inputs.readings[1]
    valid_inputs(inputs)
    r = inputs.readings[0]
    assert (r.model, r.target, r.labels) == ("m\ufffd", "inst\ufffd", {"cluster": "\ufffd"})
    assert inputs.readings[1] is plain  # ordinary readings are not copied
    assert inputs.alerts[0].summary == "low \ufffd" and inputs.alerts[0].labels == {"pool": "m\ufffd"}
    assert inputs.statuses[0].detail == "bad \ufffd"
    # model, target, cluster; alert pool, summary, its pool label; the status detail
    assert inputs.anomalies == {"invalid_text": 7.0}


def test_what_comes_in_replaced_is_served_as_utf8_everywhere():
    inputs = hostile_inputs()
    valid_inputs(inputs)
    pools = derive_pools({r.target: [r] for r in inputs.readings}, now=100.0, window_seconds=60,
                         pool_by=("cluster", "model_name"))
    snap = Snapshot(timestamp=100.0, pools=pools, sources=inputs.statuses, alerts=inputs.alerts,
                    anomalies=dict(inputs.anomalies))
    exp = Exposition()
    assert exp.update(snap)
    body = exp.body().decode("utf-8")
    assert 'headroom_active_requests{cluster="\ufffd",pool="m\ufffd"} 2.0' in body
    assert 'headroom_input_anomalies_total{kind="invalid_text"} 7.0' in body
    render(snap, Trends()).encode("utf-8")
    json.dumps(snapshot_to_dict(snap)).encode("utf-8")


def test_the_renderer_itself_never_writes_a_lone_surrogate():
    # the last line: a pool key that escaped the input check is still written as valid UTF-8
    pools = derive_pools({"t": [ReplicaReading(target="t", model="m\ud800", timestamp=100.0, running=1.0)]},
                         now=100.0, window_seconds=60)
    exp = Exposition()
    assert exp.update(Snapshot(timestamp=100.0, pools=pools))
    assert 'headroom_active_requests{pool="m\ufffd"} 1.0' in exp.body().decode("utf-8")
