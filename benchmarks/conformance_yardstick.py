"""The upstream parsers' own test cases as a yardstick for headroom's exposition parser (issue 40 item 6).

The held-out cases (`conformance-cases.json` beside `openmetrics-testdata/` and `prometheus-testdata/`,
gathered from prometheus/OpenMetrics, prometheus/client_python and prometheus/prometheus with the
reference parser's expected samples; their SOURCES.md names commits and licences) are read where
they lie, never copied into the repository: a yardstick, not a fixture.

For each valid case in scope ("claimed") headroom's full read (`parse(text)`, in OpenMetrics mode
for OpenMetrics cases) must not raise and must read every sample the reference read: the same
names, labels and values, point for point (where the reference refused a valid case, one sample per
sample line, as SOURCES.md there says). Names compare without a `_total` suffix (prometheus_client's
text parser renames counter samples; the text says which one was written). Invalid cases are
counted too: refused (raises) or flagged (an anomaly) against read without a word.

    python benchmarks/conformance_yardstick.py [--heldout /work/shared/heldout]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from monitor.kit.exposition import ExpositionError, parse  # noqa: E402


def _point(name: str, labels: dict, value) -> tuple:
    v = float(value)
    name = name[:-6] if name.endswith("_total") else name
    return name, tuple(sorted(labels.items())), "NaN" if math.isnan(v) else v


def _text(case: dict, heldout: str) -> str:
    if case.get("input") is not None:
        return case["input"]
    with open(os.path.join(heldout, case["file"]), encoding="utf-8", newline="") as f:
        return f.read()


def judge(case: dict, text: str) -> str:
    """'right', 'refused' or 'misread' for a valid case; 'refused', 'flagged' or 'accepted' for an
    invalid one."""
    try:
        got = parse(text, openmetrics=True if case["format"] == "openmetrics" else None)
    except ExpositionError:
        return "refused"
    if not case["should_parse"]:
        return "flagged" if got.anomalies else "accepted"
    if case["expected"] is None:  # the reference refused it: one sample per sample line is asked
        lines = sum(1 for line in text.split("\n") if line.strip() and not line.startswith("#"))
        return "right" if sum(map(len, got.samples.values())) == lines else "misread"
    mine = sorted(_point(n, lb, v) for n, rows in got.samples.items() for lb, v in rows)
    ref = sorted(_point(n, lb, v) for n, lb, v in case["expected"])
    return "right" if mine == ref else "misread"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heldout", default=os.environ.get("HEADROOM_HELDOUT", "/work/shared/heldout"))
    args = ap.parse_args()
    with open(os.path.join(args.heldout, "conformance-cases.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    tally: dict[str, dict[str, int]] = {"valid": {}, "invalid": {}}
    wrong = []
    for case in cases:
        if case["scope"] != "claimed":
            continue
        verdict = judge(case, _text(case, args.heldout))
        side = tally["valid" if case["should_parse"] else "invalid"]
        side[verdict] = side.get(verdict, 0) + 1
        if verdict in ("refused", "misread") and case["should_parse"]:
            wrong.append(f"{verdict}: {case['id']}")
    print(json.dumps({"claimed": tally, "valid_cases_not_read_right": wrong}, indent=1))


if __name__ == "__main__":
    main()
