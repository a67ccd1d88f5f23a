"""engine_histograms: where each bucket goes is worked out once per sequence of label sets and reused
while the parser hands the same label dicts; the counts are read afresh every scrape, and the odd
families (two buckets of one bound, a bucket without a model) read as they always did."""
from monitor.sources import engine_histograms
from monitor.sources.vllm import parse_vllm

H = "vllm:e2e_request_latency_seconds"


def _body(c1: float, c2: float, inf: float) -> str:
    return (f'{H}_bucket{{model_name="m",engine="0",le="0.5"}} {c1}\n'
            f'{H}_bucket{{model_name="m",engine="0",le="+Inf"}} {inf}\n'
            f'{H}_bucket{{model_name="m",engine="1",le="0.5"}} {c2}\n'
            f'{H}_bucket{{model_name="m",engine="1",le="+Inf"}} {inf}\n'
            f'{H}_bucket{{engine="2",le="+Inf"}} 99\n'  # no model: not read
            f'{H}_sum{{model_name="m",engine="0"}} 1.5\n{H}_count{{model_name="m",engine="0"}} {inf}\n')


def _read(body: str):
    scrape = parse_vllm(body)
    return engine_histograms._histograms(scrape.get(H + "_bucket"), scrape.get(H + "_sum"),
                                         scrape.get(H + "_count"), scrape), scrape


def test_a_layout_is_reused_and_the_counts_read_afresh():
    engine_histograms._LAYOUTS.clear()
    first, _ = _read(_body(1, 2, 4))
    assert len(engine_histograms._LAYOUTS) == 1
    second, _ = _read(_body(3, 0, 5))  # the same label sets: the same layout, new counts
    assert len(engine_histograms._LAYOUTS) == 1
    # engines 0 and 1 summed: counts (1+2, 4+4) then (3+0, 5+5); sum 1.5 (engine 1 has none);
    # count: engine 0's _count plus engine 1's +Inf bucket
    assert (first["m"].bounds, first["m"].counts, first["m"].sum, first["m"].count) == ((0.5, float("inf")), (3, 8), 1.5, 8)
    assert (second["m"].counts, second["m"].count) == ((3, 10), 10)


def test_two_buckets_of_one_bound_are_ordered_by_count():
    body = (f'{H}_bucket{{model_name="m",le="1"}} 5\n{H}_bucket{{model_name="m",le="1.0"}} 3\n'
            f'{H}_bucket{{model_name="m",le="+Inf"}} 6\n')
    for _ in range(2):  # worked out, then from the kept layout
        got, scrape = _read(body)
        assert got["m"].bounds == (1.0, 1.0, float("inf")) and got["m"].counts == (3, 5, 6)
        assert not scrape.anomalies


def test_a_bucket_out_of_order_is_not_cumulative():
    body = f'{H}_bucket{{model_name="m",le="1"}} 5\n{H}_bucket{{model_name="m",le="+Inf"}} 4\n'
    got, scrape = _read(body)
    assert got == {} and scrape.anomalies == {"histogram_not_cumulative": 1}
