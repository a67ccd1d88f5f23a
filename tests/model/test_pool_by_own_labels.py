"""`global.pool_by` may not carry a label headroom adds to its own series (issue 38, Build 1).

The extra pool_by labels are exported beside `pool` on every pool series, so `pool_by: [kind,
model_name]` put `kind` twice on the latency series (the render froze at the first quantile) and
`[reason, ...]` on the shed and queue series. The list of refused names is the catalogue's own
labels (monitor/model/catalogue.py `own_labels`), never a hand-kept list; check-config and run refuse alike
with `file: key: problem`.
"""
from __future__ import annotations

import contextlib
import io

import pytest

from monitor.commands.cli import main
from monitor.config import ConfigError, load
from monitor.model.catalogue import CATALOGUE, own_labels
from monitor.model.poolkey import MODEL_LABELS, RESERVED

SOURCES = "sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n"
# refused earlier by PoolBySetting with their own message (the pool's own name, the replica, the model)
REFUSED_BY_THE_SETTING = set(RESERVED) | set(MODEL_LABELS)
OWN = sorted(set(own_labels()) - REFUSED_BY_THE_SETTING)


def test_the_refused_names_come_from_the_catalogue():
    catalogue_labels = {label for m in CATALOGUE for label in m.labels}
    assert catalogue_labels <= set(own_labels())
    assert {"kind", "reason", "le", "quantile", "scenario", "limit", "q", "family", "window"} <= set(own_labels())
    assert "cluster" not in own_labels() and "region" not in own_labels()


@pytest.mark.parametrize("label", OWN)
def test_each_label_headroom_adds_is_refused_beside_the_pool(label, tmp_path):
    f = tmp_path / "h.yml"
    f.write_text(f"global:\n  pool_by: [{label}, model_name]\n" + SOURCES)
    with pytest.raises(ConfigError) as err:
        load(str(f))
    assert str(err.value).startswith(f"{f}: global.pool_by: '{label}' is a label headroom adds to its own series")


@pytest.mark.parametrize("label", ["kind", "reason", "le"])
def test_the_last_label_may_be_one_of_them_it_names_the_pool(label, tmp_path):
    f = tmp_path / "h.yml"
    f.write_text(f"global:\n  pool_by: [cluster, {label}]\n" + SOURCES)
    assert load(str(f)).pool_by == ("cluster", label)


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue().strip()


@pytest.mark.parametrize("pool_by", ["[kind, model_name]", "[reason, cluster, model_name]"])
def test_check_config_and_run_refuse_alike(pool_by, tmp_path):
    f = tmp_path / "h.yml"
    f.write_text(f"global:\n  pool_by: {pool_by}\n" + SOURCES)
    checked = run_cli(["check-config", str(f)])
    ran = run_cli(["run", "--config.file", str(f)])
    assert checked[0] == ran[0] == 2
    label = pool_by.strip("[").split(",")[0]
    assert f"{f}: global.pool_by: '{label}' is a label headroom adds" in checked[1]
    assert checked[1].splitlines()[-1] == ran[1].splitlines()[-1]
