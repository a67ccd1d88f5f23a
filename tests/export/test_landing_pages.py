"""The landing page of a large fleet is paged, the pools under most pressure first (issue 38, Why 5):
2,000 pools made a 2.3 MB page that took Chromium 15.5 s. Past LANDING_PAGE_POOLS pools the page
shows that many cards, least headroom first, says how many there are and links the other pages
(`?page=N`); a small fleet's page is as it was. Sizes and render times: benchmarks/landing_bench.py."""
from __future__ import annotations

import re

from monitor.export.collector import Exposition
from monitor.export.landing import Trends, render
from monitor.export.landing_pages import LANDING_PAGE_POOLS
from monitor.export.server import WebState, handle
from monitor.kit.web.http11 import Request
from monitor.model import Capacity, PoolSnapshot, Scenarios, Snapshot

NOW = 1_796_300_000.0


def fleet(pools: int) -> tuple[Snapshot, Trends]:
    """`pools` pools, pool i with headroom ((i * 7919) % pools) / pools: every ratio once, in no order;
    the last pool's headroom unknown."""
    trends, snaps = Trends(), []
    for i in range(pools):
        name = f"pool-{i:04d}"
        ratio = None if i == pools - 1 else ((i * 7919) % pools) / pools
        snaps.append(PoolSnapshot(pool=name, model=name, replicas=4, replicas_configured=4, active_requests=270.0,
                                  queued_requests=12.0, kv_usage_ratio=0.75,
                                  capacity=Capacity(ratio=Scenarios(ratio, None))))
        trends.seed(name, [(NOW - 6 * 3600 + 60 * k, 200.0 + k % 50, float(k % 7), 0.7) for k in range(360)])
    return Snapshot(timestamp=NOW, pools=snaps), trends


def cards(page: str) -> list[str]:
    return re.findall(r'<section class="card[^"]*">\s*<h2>([^<]+)<', page)


def headroom(snap: Snapshot) -> dict[str, float]:
    return {p.pool: p.capacity.ratio.current for p in snap.pools if p.capacity.ratio.current is not None}


def test_a_large_fleet_shows_the_pools_with_least_headroom_first_and_links_the_rest():
    snap, trends = fleet(2000)
    page = render(snap, trends)
    ratios = headroom(snap)  # once: the sort key below is asked 2,000 times
    by_headroom = sorted(ratios, key=lambda k: (ratios[k], k))
    least = by_headroom[:LANDING_PAGE_POOLS]
    assert cards(page) == least
    assert len(page.encode()) < 400_000  # was 2.3 MB with every pool
    assert f"{LANDING_PAGE_POOLS} of 2,000 pools" in page and 'href="?page=2"' in page
    assert 'href="?page=40"' in page  # the last page: 2,000 / 50
    second = render(snap, trends, page=2)
    assert cards(second) == by_headroom[50:100]
    last = render(snap, trends, page=40)
    assert cards(last)[-1] == "pool-1999"  # headroom unknown: last
    assert cards(render(snap, trends, page=99)) == cards(last)  # past the end: the last page


def test_a_small_fleet_is_shown_whole_as_before():
    snap, trends = fleet(LANDING_PAGE_POOLS)
    page = render(snap, trends)
    assert cards(page) == [p.pool for p in snap.pools]  # every pool, in the fleet's order
    assert "?page=" not in page


def test_the_server_serves_each_page_once_per_snapshot():
    snap, trends = fleet(120)
    state = WebState(Exposition(), trends)
    state.publish(snap)

    def get(target: str) -> str:
        path = target.split("?")[0]
        return handle(state, Request("GET", target, path, "HTTP/1.1", {})).body.decode()
    first, third = get("/"), get("/?page=3")
    assert len(cards(first)) == 50 and len(cards(third)) == 20
    assert set(cards(first)).isdisjoint(cards(third))
    assert get("/?page=3") is not None and get("/?page=7") == third  # past the end: the last page, one copy
    assert get("/?page=x") == first and get("/?page=-2") == first  # a bad number: the first page
    assert len(state._rendered) <= 3  # "/" pages cached: 1 and 3, and the JSON's none yet
