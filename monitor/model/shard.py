"""Split the pools between several headroom instances (`headroom run --shard i/n`).

Each instance owns the pools whose stable hash picks its shard index, so n instances with the
shards 0/n .. n-1/n together own every pool exactly once. Two instances started with the *same*
shard own the same pools and export the same series: that is the high-availability pair, deduped
downstream (see docs/deploy.md).

The owner of a pool is chosen by rendezvous (highest-random-weight) hashing over blake2b digests:
- stable across processes, hosts and Python versions (never Python's salted `hash()`);
- going from n to n+1 shards moves only the pools the new shard wins (about 1/(n+1) of them),
  where `hash % n` would reshuffle most pools and restart their learned state elsewhere.

Shard indices are 0-based, like StatefulSet ordinals: `0/2` and `1/2` are the two halves.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from monitor.kit.settings.kinds import Kind
from monitor.model.poolkey import make_key

Shard = tuple[int, int]


class ShardError(ValueError):
    """A malformed `--shard` value."""


def parse_shard(text: str) -> Shard:
    """Parse "i/n" (0 <= i < n) into (i, n); raise ShardError with a readable reason."""
    raw = str(text).strip()
    index_text, sep, total_text = raw.partition("/")
    if not sep:
        raise ShardError(f"shard {text!r} must look like INDEX/TOTAL, e.g. 0/2")
    try:
        index, total = int(index_text.strip()), int(total_text.strip())
    except ValueError:
        raise ShardError(f"shard {text!r}: INDEX and TOTAL must be whole numbers, e.g. 1/3") from None
    if total < 1:
        raise ShardError(f"shard {text!r}: TOTAL must be at least 1")
    if not 0 <= index < total:
        raise ShardError(
            f"shard {text!r}: INDEX must be between 0 and {total - 1} (shard indices are 0-based)"
        )
    return index, total


def _check(shard: Shard) -> Shard:
    index, total = shard
    if isinstance(index, bool) or isinstance(total, bool) or not (
        isinstance(index, int) and isinstance(total, int)
    ):
        raise ShardError(f"shard {shard!r} must be a pair of integers")
    if total < 1 or not 0 <= index < total:
        raise ShardError(f"shard {shard!r} out of range: need 0 <= index < total")
    return index, total


def _weight(pool: str, index: int) -> int:
    digest = hashlib.blake2b(f"{index}\x00{pool}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(pool: str, total: int) -> int:
    """The shard index (0 .. total-1) that owns `pool` when there are `total` shards."""
    _check((0, total))
    if total == 1:
        return 0
    # Ties between 64-bit weights are practically impossible; max() picks the lowest index then.
    return max(range(total), key=lambda index: (_weight(pool, index), -index))


def owns(pool: str, shard: Shard) -> bool:
    """True when the instance running `shard` (index, total) is responsible for `pool`."""
    index, total = _check(shard)
    return owner(pool, total) == index



def filter_pools(pools: Iterable[str], shard: Shard) -> list[str]:
    """The pools of `pools` (model names) this shard owns, in their original order (duplicates
    kept): what a Prometheus-mode shard asks its query layer for (monitor/sources/prometheus_reader.py).
    Owned by their pool key, as the cycle owns them (the name itself but for a name that would read
    back as labels: monitor/model/poolkey.py)."""
    index, total = _check(shard)
    if total == 1:
        return list(pools)
    return [pool for pool in pools if owner(make_key(pool), total) == index]

class ShardSetting(Kind):
    """`global.shard` in the configuration: I/N, read by parse_shard."""
    name = "I/N"

    def parse(self, v: object) -> "Shard":
        if not isinstance(v, str):
            raise ValueError(f"expected a shard like 0/2, got {v!r}")
        return parse_shard(v)
