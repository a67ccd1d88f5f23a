"""check-config and load refuse a `sources.prometheus.selector` that is not a PromQL label-matcher
list and a scrape target URL without a path, naming the file, the key and the problem."""
from __future__ import annotations

import pytest
import yaml

from monitor.commands import cli
from monitor.config import ConfigError, from_dict, load

PROM = {"sources": {"prometheus": {"url": "http://prom:9090"}}}


def _prom(selector: str) -> dict:
    return {"sources": {"prometheus": {"url": "http://prom:9090", "selector": selector}}}


@pytest.mark.parametrize("selector, read", [
    ('job="vllm",namespace=~"a|b"', 'job="vllm",namespace=~"a|b"'), ("", ""),
    (' job!="x", team!~`a.*`, ', 'job!="x", team!~`a.*`'), ("{job='vllm'}", "job='vllm'"),
    ('job="a\\"b"', 'job="a\\"b"')])
def test_promql_matcher_lists_are_accepted_without_braces_or_a_trailing_comma(selector, read):
    assert from_dict(_prom(selector), "f.yml").prometheus.selector == read


@pytest.mark.parametrize("selector, hint", [
    ("job=vllm", "quote the value"),
    ('{job="x"', "braces must enclose the whole list"),
    ("foo bar", 'expected name="value"'),
    ('job="x" team="y"', "expected a comma between two matchers"),
    ('job="x', "a quoted value is not closed"),
    ('job="x",,team="y"', 'expected name="value"'),
])
def test_a_selector_that_is_not_promql_names_the_key_and_the_problem(selector, hint):
    with pytest.raises(ConfigError) as exc:
        from_dict(_prom(selector), "bad.yml")
    text = str(exc.value)
    assert text.startswith("bad.yml: sources.prometheus.selector: not a PromQL label-matcher list")
    assert hint in text


@pytest.mark.parametrize("section, where", [
    ({"vllm": {"targets": ["http://vllm-0:8000"]}}, "sources.vllm.targets[0]"),  # the shorthand
    ({"vllm": {"targets": [{"url": "http://vllm-0:8000/"}]}}, "sources.vllm.targets[0].url"),
    ({**PROM["sources"], "gateways": [{"kind": "litellm", "url": "http://litellm:4000"}]}, "sources.gateways[0].url"),
    ({**PROM["sources"], "dcgm": {"targets": ["http://dcgm:9400"]}}, "sources.dcgm.targets[0]"),
])
def test_a_target_url_without_a_path_says_add_metrics(section, where):
    with pytest.raises(ConfigError) as exc:
        from_dict({"sources": section}, "bad.yml")
    text = str(exc.value)
    assert text.startswith(f"bad.yml: {where}: the URL has no path")
    assert "add /metrics" in text


def test_check_config_refuses_both_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(_prom("job=vllm")))
    assert cli.main(["check-config", str(bad)]) == 2
    assert f"{bad}: sources.prometheus.selector: not a PromQL" in capsys.readouterr().err
    bad.write_text(yaml.safe_dump({"sources": {"vllm": {"targets": ["http://vllm-0:8000"]}}}))
    assert cli.main(["check-config", str(bad)]) == 2
    assert "add /metrics (e.g. http://vllm-0:8000/metrics)" in capsys.readouterr().err
    good = tmp_path / "good.yml"
    good.write_text(yaml.safe_dump({"sources": {"vllm": {"targets": ["http://vllm-0:8000/metrics"]}}}))
    assert cli.main(["check-config", str(good)]) == 0
    assert load(str(good)).vllm_targets[0].url == "http://vllm-0:8000/metrics"
