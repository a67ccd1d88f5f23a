"""One catalogue: docs are generated from it, names follow Prometheus conventions."""
import os
import re

from monitor.model.catalogue import CATALOGUE, render_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_docs_metrics_md_is_current():
    with open(os.path.join(ROOT, "docs", "metrics.md"), encoding="utf-8") as f:
        assert f.read() == render_markdown(), "run `make docs` to regenerate docs/metrics.md"


def test_names_follow_conventions():
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names))
    for m in CATALOGUE:
        assert re.fullmatch(r"headroom_[a-z0-9_]+", m.name), m.name
        assert ":" not in m.name
        assert not m.name.endswith("_total"), "counters are declared without _total"
        assert m.type in ("gauge", "counter")
        assert m.help.endswith(".") or m.help.endswith(")"), m.name
        assert "type" not in m.labels
        for label in m.labels:
            assert re.fullmatch(r"[a-z_]+", label)
