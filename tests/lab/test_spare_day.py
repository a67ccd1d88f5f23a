"""A simulated day on a driven clock, small (issue 39's proof, its structural half; the full-size
figures are benchmarks/spare_day.py's): a batch of deferrable work handed over at 08:00 and started
where /api/v1/spare says completes within the day, and the interactive share over target stays
within the SLO (as with no batch at all); the same batch started at the 09:00 peak breaks it.

The pool: 8 slots, interactive calls at up to 1 a second (4 s each), a batch of 1,500 calls of 20 s
kept 4 in flight (~2.1 h), an interactive call waiting over 2 s for its slot is over target, the
objective 95 % (lab/headroom_lab/sim/spare_day.py)."""
from __future__ import annotations

from headroom_lab.sim.spare_day import DayParams, run_day

SMALL = DayParams(slots=8, peak_rate=1.0, batch_calls=1500, concurrency=4)
ALLOWED = 1 - SMALL.objective


def test_spare_scheduled_batch_completes_within_slo_and_the_peak_start_breaks_it():
    alone = run_day(SMALL, None, seed=3)
    spare = run_day(SMALL, "spare", seed=3)
    peak = run_day(SMALL, 9 * 3600.0, seed=3)
    assert spare.answer["fits"] is True
    # the earliest window holding 4 for the batch's ~2.6 h (x 1.25) is after the afternoon, before midnight
    assert 16 * 3600 < spare.batch_start_s < spare.batch_done_s < 24 * 3600
    assert spare.interactive_over_ratio <= ALLOWED and spare.interactive_over_ratio <= alone.interactive_over_ratio + 0.002
    assert max(spare.over_by_hour) <= ALLOWED
    assert peak.batch_done_s is not None and peak.interactive_over_ratio > ALLOWED
    assert max(peak.over_by_hour) > 0.5  # the peak's hours: most calls over target
