"""The forecast dashboard's panels of spare capacity for deferrable work (issue 39, docs/spare-capacity.md)."""
from __future__ import annotations

from blocks import P, row, stat, target, timeseries


def spare_panels() -> list[dict]:
    return [
        row("Spare capacity for deferrable work"),
        timeseries("Spare requests for deferrable work ($pool)", [
            target(f'headroom_spare_requests{{{P},horizon="now"}}', "spare now"),
            target(f'headroom_spare_requests{{{P},horizon="1h"}}', "spare over 1 h"),
            target(f'headroom_spare_requests{{{P},horizon="6h"}}', "spare over 6 h"),
            target(f"headroom_deferrable_requests{{{P}}}", "deferrable running"),
        ], description="Concurrent deferrable requests that fit below the knee x (1 - capacity.spare_margin) beside "
                       "the interactive load's forecast 95% band: the fewest from now to each horizon's end. "
                       "Deferrable running above 'spare now' eats into interactive headroom "
                       "(HeadroomDeferrableOverSpare).", repeat="pool", repeatDirection="h", maxPerRow=2, w=24, h=8,
            min_=0),
        stat("Deferrable budget", [target(f"headroom_deferrable_budget_ratio{{{P}}}", "{{pool}}")],
             unit="percentunit", decimals=2, w=12,
             description="D in [0, 1] for a batch dispatcher's gate (llm-d async processor prometheus-query); "
                         "0 when the data behind it is stale or the pool is over its SLO now.",
             thresholds=[(None, "red"), (0.05, "orange"), (0.2, "green")]),
        stat("Spare over the next day", [target(f'headroom_spare_requests{{{P},horizon="1d"}}', "{{pool}}")],
             w=12, description="The fewest deferrable requests that fit at every moment of the next 24 hours."),
    ]
