"""The vLLM and SGLang readers give exactly the readings they gave when tests/golden/readings.json was
written: every engine capture under tests/fixtures, each read by both
readers from the fast parse and from a full parse, and seeded edits (fast parse only) of each capture (values NaN,
negative, huge; lines dropped or doubled; engine, rank and model labels changed; `_` and Ray
spellings). Exact: every field of every reading, key order, int versus float, and the anomalies the
reader (not the parser) counted.

The unedited captures' outcomes are kept whole (a diff shows what changed); the edited ones as a
sha256 of the same JSON. Rewrite the file only on purpose, when a reader's behaviour is meant to change:

    .venv/bin/python tests/sources/test_reader_golden.py --write
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import sys

import pytest

from monitor.kit.exposition import ExpositionError, parse
from monitor.model import Histogram
from monitor.sources import sglang, vllm

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
FIXTURES = os.path.join(HERE, "fixtures")
GOLDEN = os.path.join(HERE, "golden", "readings.json")
EDITS_PER_CAPTURE = 40
READERS = {"vllm": (vllm, vllm.parse_vllm), "sglang": (sglang, sglang.parse_sglang)}


def captures() -> list[str]:
    """Every engine capture under tests/fixtures, as a path relative to it (gateway bodies and the
    OpenMetrics parser suite are not engine scrapes)."""
    out = []
    for root, dirs, files in os.walk(FIXTURES):
        dirs[:] = sorted(d for d in dirs if d not in ("gateway", "openmetrics"))
        for name in sorted(files):
            if name.endswith((".prom", ".txt")):
                out.append(os.path.relpath(os.path.join(root, name), FIXTURES))
    return sorted(out)


def _plain(value):
    if isinstance(value, Histogram) or dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [[k, _plain(v)] for k, v in value.items()]  # pairs: key order is part of the answer
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def outcome(reader, scrape) -> str:
    """The readings of one parse by one reader and the anomalies the reader added, as JSON."""
    before = dict(scrape.anomalies)
    try:
        readings = reader.readings_from_scrape(scrape, "http://t:8000/metrics", 100.0, {"pool": "p"})
    except Exception as e:
        return f"raised {type(e).__name__}"
    added = {k: v - before.get(k, 0) for k, v in scrape.anomalies.items() if v != before.get(k, 0)}
    return json.dumps({"readings": [_plain(r) for r in readings], "anomalies": sorted(added.items())})


def outcomes(text: str, full: bool = True) -> dict[str, str]:
    """reader/parse -> outcome JSON (or "parse_error" when the parser refuses the body); the full
    parse too when `full`."""
    out = {}
    for name, (reader, fast) in READERS.items():
        for how, parser in (("fast", fast), ("full", parse))[:2 if full else 1]:
            try:
                scrape = parser(text)
            except ExpositionError:
                out[f"{name}/{how}"] = "parse_error"
                continue
            out[f"{name}/{how}"] = outcome(reader, scrape)
    return out


_VALUES = ("NaN", "-1", "+Inf", "0", "1e300", "3", "0.5", "2e6", "1e13")
_LABEL_EDITS = (('engine="0"', 'engine="1"'), ('dp_rank="0"', 'dp_rank="1"'), ('tp_rank="0"', 'tp_rank="1"'),
                ('pp_rank="0"', 'pp_rank="1"'), ('model_name=', 'model_nome='), ('{', '{ReplicaId="r1",'),
                ('{', '{priority="1",'), ('priority="1"', 'priority=""'), ('engine="0"', 'engine=""'),
                ('finished_reason="stop"', 'finished_reason="abort"'), ('le="+Inf"', 'le="1e9"'))


def _edit_line(line: str, rng: random.Random) -> list[str]:
    kind = rng.randrange(6)
    if kind == 0:
        return [line.rsplit(" ", 1)[0] + " " + rng.choice(_VALUES)]
    if kind == 1:
        return []
    if kind == 2:
        return [line, line]
    if kind == 3:
        old, new = rng.choice(_LABEL_EDITS)
        return [line.replace(old, new, 1)]
    if kind == 4:
        return [re.sub(r"^(vllm|sglang):", r"\1_", line)]
    return [line, re.sub(r'engine="(\d*)"', r'engine="\g<1>9"', re.sub(r'dp_rank="(\d*)"', r'dp_rank="\g<1>9"', line))]


def edited(text: str, rng: random.Random) -> str:
    """One seeded edit of a capture: one to four sample lines changed, sometimes the whole body respelled."""
    lines = text.split("\n")
    samples = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    whole = rng.randrange(8)
    if whole == 0:
        lines = [line.replace("vllm:", "ray_vllm:") for line in lines]
    elif whole == 1:
        lines = [re.sub(r'\bengine="[^"]*",?', "", line).replace(",}", "}") for line in lines]
    if not samples:
        return "\n".join(lines)
    if rng.random() < 0.5:  # half the time gauges and counters only: histograms' buckets are most lines
        samples = [i for i in samples if "_bucket" not in lines[i]] or samples
    chosen = set(rng.sample(samples, min(len(samples), rng.randint(1, 4))))
    out = []
    for i, line in enumerate(lines):
        out.extend(_edit_line(line, rng) if i in chosen else [line])
    return "\n".join(out)


def digest(outs: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()


def compute() -> dict:
    golden = {}
    for path in captures():
        with open(os.path.join(FIXTURES, path), encoding="utf-8") as f:
            text = f.read()
        rng = random.Random(path)
        golden[path] = {"whole": outcomes(text),
                        "edits": [digest(outcomes(edited(text, rng), full=False)) for _ in range(EDITS_PER_CAPTURE)]}
    return golden


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN, encoding="utf-8") as f:
        return json.load(f)


def test_every_capture_is_in_the_golden_file(golden):
    assert sorted(golden) == captures()


@pytest.mark.parametrize("path", captures())
def test_readings_are_exactly_the_golden_ones(golden, path):
    with open(os.path.join(FIXTURES, path), encoding="utf-8") as f:
        text = f.read()
    assert outcomes(text) == golden[path]["whole"]
    rng = random.Random(path)
    for n, want in enumerate(golden[path]["edits"]):
        body = edited(text, rng)
        assert digest(outcomes(body, full=False)) == want, f"edit {n} of {path} reads differently:\n{body}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(compute(), f, indent=1, sort_keys=True)
        f.write("\n")
