"""monitor/model/shard.py: pools split between `--shard i/n` instances, each pool owned exactly once."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.model.shard import ShardError, filter_pools, owner, owns, parse_shard


def assignment(pools, total):
    return {index: filter_pools(pools, (index, total)) for index in range(total)}

REPO = Path(__file__).resolve().parents[2]

# 50 pool names shaped like real ones: model names, some with tenants, sizes and versions.
POOLS_50 = [
    f"{family}-{size}-{variant}"
    for family in ("llama-3.1", "qwen2.5", "mistral", "gemma-2", "phi-3")
    for size in ("8b", "32b")
    for variant in ("instruct", "chat", "tools", "office", "batch")
]
assert len(set(POOLS_50)) == 50

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def _sim_pools() -> list[str]:
    """Pools of the demo simulated fleet: the pool names and the model names headroom keys them by."""
    from headroom_lab.sim.fleet import load_config

    fleet = load_config()
    return sorted({p.name for p in fleet.pools} | {p.model_name for p in fleet.pools})


POOL_SETS = {"fifty": POOLS_50, "sim-fleet": _sim_pools()}
assert len(POOL_SETS["sim-fleet"]) >= 2


# ---------------------------------------------------------------- parse_shard


@pytest.mark.parametrize("text,expected", [("0/1", (0, 1)), ("0/2", (0, 2)), ("1/2", (1, 2)),
                                           (" 2 / 3 ", (2, 3)), ("9/10", (9, 10))])
def test_parse_shard_accepts(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text,fragment", [
    ("", "INDEX/TOTAL"),
    ("1", "INDEX/TOTAL"),
    ("a/2", "whole numbers"),
    ("1/b", "whole numbers"),
    ("1.0/2", "whole numbers"),
    ("0/0", "at least 1"),
    ("1/-2", "at least 1"),
    ("2/2", "0-based"),
    ("-1/2", "between 0 and 1"),
    ("1/2/3", "whole numbers"),
])
def test_parse_shard_rejects_with_a_reason(text, fragment):
    with pytest.raises(ShardError) as err:
        parse_shard(text)
    assert fragment in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("bad", [(2, 2), (0, 0), (-1, 3), ("0", 2), (True, 2), (0.0, 1)])
def test_owns_rejects_bad_shard_tuples(bad):
    with pytest.raises(ShardError):
        owns("pool", bad)


# ---------------------------------------------------------------- ownership


@pytest.mark.parametrize("set_name", sorted(POOL_SETS))
@pytest.mark.parametrize("total", [1, 2, 3, 4, 7])
def test_instances_own_disjoint_pools_whose_union_is_all(set_name, total):
    pools = POOL_SETS[set_name]
    owned = [set(filter_pools(pools, (index, total))) for index in range(total)]
    for a in range(total):
        for b in range(a + 1, total):
            assert not owned[a] & owned[b], f"shards {a} and {b} both own {owned[a] & owned[b]}"
    assert set().union(*owned) == set(pools)
    assert sum(len(o) for o in owned) == len(pools)
    for pool in pools:
        assert [owns(pool, (i, total)) for i in range(total)].count(True) == 1


def test_two_instances_split_fifty_pools_in_balance():
    first, second = filter_pools(POOLS_50, (0, 2)), filter_pools(POOLS_50, (1, 2))
    assert len(first) + len(second) == 50
    # a fair coin gives 25 +- 3.5; 15..35 is ~2.8 sigma, so a skewed hash would show
    assert 15 <= len(first) <= 35, (len(first), len(second))


@pytest.mark.parametrize("total", [3, 4, 5])
def test_more_shards_stay_balanced(total):
    sizes = [len(v) for v in assignment(POOLS_50, total).values()]
    assert min(sizes) >= 1
    assert max(sizes) <= 2 * 50 / total, sizes


def test_same_shard_twice_is_the_same_pools():
    # the HA pair: identical shard -> identical pool list (hence identical series)
    assert filter_pools(POOLS_50, (1, 3)) == filter_pools(list(POOLS_50), (1, 3))


def test_growing_shards_moves_only_pools_to_the_new_shard():
    before, after = {p: owner(p, 4) for p in POOLS_50}, {p: owner(p, 5) for p in POOLS_50}
    moved = [p for p in POOLS_50 if before[p] != after[p]]
    assert all(after[p] == 4 for p in moved), "a pool moved between two shards that both existed"
    assert 0 < len(moved) < 25


def test_owner_follows_the_documented_rendezvous_hash():
    # recomputed here from the docstring's definition, so a silent change of hash function (which
    # would move every pool during a rolling upgrade) fails this test
    def spec_owner(pool, total):
        weights = [int.from_bytes(hashlib.blake2b(f"{i}\x00{pool}".encode(), digest_size=8).digest(), "big")
                   for i in range(total)]
        return weights.index(max(weights))

    for total in (2, 3, 8):
        for pool in POOLS_50:
            assert owner(pool, total) == spec_owner(pool, total)


def test_unicode_pool_names():
    pools = ["modèle-fr", "模型-zh", "model-🙂", "plain"]
    owned = [set(filter_pools(pools, (i, 2))) for i in range(2)]
    assert owned[0] | owned[1] == set(pools) and not owned[0] & owned[1]


def test_stable_across_processes_with_different_hash_seeds():
    code = (
        "import json, sys; from monitor.model.shard import owner; "
        "pools = json.loads(sys.stdin.read()); "
        "print(json.dumps({t: [owner(p, t) for p in pools] for t in (2, 3, 5)}))"
    )
    results = []
    for seed in ("1", "2", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(POOLS_50), env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
        results.append(json.loads(out.stdout))
    here = json.loads(json.dumps({t: [owner(p, t) for p in POOLS_50] for t in (2, 3, 5)}))
    assert results[0] == results[1] == results[2] == here
