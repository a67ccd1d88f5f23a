"""The landing page of a large fleet, paged: the pools under most pressure first.

2,000 pools made a 2.3 MB page that took Chromium 15.5 s: past LANDING_PAGE_POOLS pools the page
(monitor/export/landing.py `render`) shows that many, least headroom first, says how many there are
and links the others (`?page=N`, read by monitor/export/server.py with `page_number`);
/api/v1/snapshot and /metrics have them all. Sizes and times: benchmarks/landing_bench.py.
"""
from __future__ import annotations

import urllib.parse

from ..model import PoolSnapshot

LANDING_PAGE_POOLS = 50


def page_count(pools: int) -> int:
    """How many pages the landing page of `pools` pools has (1 up to LANDING_PAGE_POOLS)."""
    return max(1, -(-pools // LANDING_PAGE_POOLS))


def page_number(query: str, pools: int) -> int:
    """The page `?page=N` of a request's query asks for, within 1 .. page_count(pools) (a bad number: 1)."""
    values = urllib.parse.parse_qs(query).get("page", ["1"])
    try:
        n = int(values[0])
    except ValueError:
        return 1
    return min(max(1, n), page_count(pools))


def _pressure(p: PoolSnapshot) -> tuple:
    """Sort key, most pressure first: least headroom now (unknown last), then the most load, then the name."""
    ratio = p.capacity.ratio.current if p.capacity is not None else None
    return (ratio is None, ratio if ratio is not None else 0.0, -(p.load_requests or 0.0), p.pool)


def paged(pools: list[PoolSnapshot], page: int) -> tuple[list[PoolSnapshot], str]:
    """(the pools page `page` shows, the line that says which and links the others): every pool, in
    the fleet's order and no line, up to LANDING_PAGE_POOLS; else that many, most pressure first."""
    if len(pools) <= LANDING_PAGE_POOLS:
        return pools, ""
    pages = page_count(len(pools))
    page = min(max(1, page), pages)
    start = (page - 1) * LANDING_PAGE_POOLS
    shown = sorted(pools, key=_pressure)[start:start + LANDING_PAGE_POOLS]
    nav = " ".join(f'<a href="?page={n}">{n}</a>' if n != page else f"<b>{n}</b>" for n in range(1, pages + 1))
    line = (f'<p class="pages">Pools {start + 1:,}-{start + len(shown):,} of the fleet\'s: {len(shown):,} of '
            f'{len(pools):,} pools, least headroom first (all of them: <a href="/api/v1/snapshot">/api/v1/snapshot'
            f'</a>, <a href="/metrics">/metrics</a>). Pages: {nav}</p>')
    return shown, line
