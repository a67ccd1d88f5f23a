"""A bad value is refused naming its key (`file: key: problem`): a date that is no date (it is not
"invalid YAML"), and every count and size bounded to a sane range (1e308 is refused, never accepted
as a capacity)."""
import pytest

from monitor.capacity.mix import parse_mix
from monitor.config import ConfigError, load
from monitor.kit.settings.kinds import LIMIT, Int, Number

TARGET = "sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n"


def refused(tmp_path, text: str) -> str:
    p = tmp_path / "headroom.yml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(str(p))
    return str(err.value).replace(str(p), "headroom.yml")


@pytest.mark.parametrize("day", ["2026-02-30", "2026-13-01", "2026-04-31"])
def test_a_bad_calendar_date_names_its_key(tmp_path, day):
    assert refused(tmp_path, TARGET + f"calendar:\n  non_working: [2026-12-24, {day}]\n") == \
        f"headroom.yml: calendar.non_working[1]: expected a date like 2026-12-24, got '{day}'"


def test_good_dates_are_still_dates(tmp_path):
    import datetime as dt
    p = tmp_path / "headroom.yml"
    p.write_text(TARGET + "calendar:\n  non_working: [2026-12-24, '2026-12-28']\n")
    assert load(str(p)).calendar.non_working == [dt.date(2026, 12, 24), dt.date(2026, 12, 28)]


@pytest.mark.parametrize("key, value, problem", [
    ("pools:\n  m:\n    max_num_seqs", "1.0e+308", "pools.m.max_num_seqs: expected an integer, got 1e+308"),
    ("pools:\n  m:\n    max_num_seqs", "10000000", "pools.m.max_num_seqs: must be <= 1000000, got 10000000"),
    ("pools:\n  m:\n    watts_per_replica", "1.0e+308", "pools.m.watts_per_replica: must be <= 1e+06, got 1e+308"),
    ("capacity:\n  kv_tokens_per_request", "1.0e+308", "capacity.kv_tokens_per_request: must be <= 1e+08, got 1e+308"),
    ("capacity:\n  active_requests_per_session", "1.0e+308",
     "capacity.active_requests_per_session: must be <= 1e+06, got 1e+308"),
    ("capacity:\n  min_observations", "1000000000000", "capacity.min_observations: must be <= 1000000, got 1000000000000"),
    ("global:\n  max_series", "1000000000000", "global.max_series: must be <= 100000000, got 1000000000000"),
])
def test_capacities_are_bounded_naming_the_key(tmp_path, key, value, problem):
    assert refused(tmp_path, TARGET + f"{key}: {value}\n") == f"headroom.yml: {problem}"


def test_every_count_and_size_has_an_upper_bound():
    assert Number(gt=0).parse(LIMIT) == LIMIT and Int(ge=1).parse(LIMIT) == LIMIT
    with pytest.raises(ValueError, match="must be <= 1000000000, got 1e\\+308"):
        Number(gt=0).parse(1e308)
    with pytest.raises(ValueError, match="must be <= 1000000000"):
        Int(ge=1).parse(10 ** 12)
    assert Number(ge=0, lt=1).parse(0.5) == 0.5  # its own bound stays the bound


def test_the_plan_mix_refuses_a_huge_kv_capacity():
    data = {"task_types": {"ask": {"tasks_per_second": 1, "calls_per_task": 1, "seconds_per_call": 2}},
            "kv_capacity_tokens_per_replica": 1e308}
    with pytest.raises(ConfigError, match=r"^mix: kv_capacity_tokens_per_replica: must be <= 1e\+09, got 1e\+308$"):
        parse_mix(data)
