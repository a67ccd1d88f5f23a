"""Per-series model selection from backtest scores (pure): the one rule `forecast_series` (the
daemon, the digest, the benchmark) and `headroom backtest` share.

`select(skill, order, tolerance, average_below_skill)`:
- among the models that score no worse than the best seasonal naive on the same folds, the earliest
  in `order` whose MASE is within (1 + tolerance) of their lowest is selected (`rank_models`);
- but when no model's MASE is below `average_below_skill` (1.0: none beats the in-sample one-day
  seasonal naive), none has shown skill and the pick would follow noise: the selection is
  `average`, the equal-weight average of every plain (non-combination) scored model;
- `Selection.why` says, per scored model, why it was or was not selected.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from monitor.forecast.models import combine, get_model
from monitor.forecast.scores import Fold

# the seasonal naives: a selected model must score at least as well as the best of them
NAIVE_MODELS = ("snaive_day", "snaive_week", "snaive_week_level")
AVERAGE = "average"  # the model name of the no-skill average (see ForecastSettings.average_below_skill)


def naive_bar(skill: dict[str, dict]) -> Optional[tuple[str, float]]:
    """(model, MASE) of the best seasonal naive backtested on these folds, or None."""
    naive = [(skill[m]["mase"], m) for m in NAIVE_MODELS if skill.get(m, {}).get("mase") is not None]
    return (min(naive)[1], min(naive)[0]) if naive else None


def _eligible(skill: dict[str, dict], order) -> tuple[Optional[tuple[str, float]], dict, dict]:
    """(the naive bar, MASE of each scored model of `order`, those of them no worse than the bar),
    the dicts in `order`: what `rank_models` ranks and `selection_reasons` explains."""
    bar = naive_bar(skill)
    scored = {m: skill[m]["mase"] for m in order if skill.get(m, {}).get("mase") is not None}
    eligible = {m: v for m, v in scored.items() if bar is None or m in NAIVE_MODELS or v <= bar[1]}
    return bar, scored, eligible


def rank_models(skill: dict[str, dict], order: list[str], tolerance: float) -> list[str]:
    """Models by preference: among the models that score no worse than the best seasonal naive
    on the same folds, the earliest in `order` whose MASE is within (1 + tolerance) of their best
    comes first; then the rest by MASE. Models without a MASE go last, in order."""
    _bar, scored, eligible = _eligible(skill, order)
    without = [m for m in order if m not in scored]
    if not scored:
        return without
    best = min(eligible.values())
    first = next(m for m, v in eligible.items() if v <= best * (1 + tolerance))
    rest = sorted((m for m in scored if m != first), key=lambda m: scored[m])
    return [first] + rest + without


def no_skill_members(skill: dict[str, dict], order, threshold: float) -> list[str]:
    """The plain (non-combination) backtested models of `order` to average when none of the
    backtested models reached a MASE below `threshold`; [] when one did, the rule is off
    (threshold 0) or fewer than two could be averaged."""
    scored = [m for m in skill if skill[m].get("mase") is not None]
    if threshold <= 0 or not scored or min(skill[m]["mase"] for m in scored) < threshold:
        return []
    members = [m for m in order if m in scored and not hasattr(get_model(m), "members")]
    return members if len(members) >= 2 else []


def selection_reasons(skill: dict[str, dict], order: list[str], tolerance: float,
                      chosen: Optional[str], average: tuple[str, ...] | list[str] = (),
                      threshold: float = 1.0) -> dict[str, str]:
    """One line per backtested model of `order`: why it was or was not selected (`headroom backtest`
    prints it). `chosen` is the model forecast (a fallback when the selected one failed its final
    fit); AVERAGE with its `average` members when the no-skill rule applied (`threshold`)."""
    bar, scored, eligible = _eligible(skill, order)
    best = min(eligible.values()) if eligible else None
    out = {}
    for m in order:
        v = scored.get(m)
        if m == chosen:
            out[m] = (f"selected: MASE {v:.3f}, the earliest within {tolerance:.0%} of the best ({best:.3f})"
                      if v is not None and best is not None else "selected")
        elif v is None:
            out[m] = "no backtest score (history too short for its folds, or every fold failed)"
        elif chosen == AVERAGE:
            out[m] = (f"not selected: MASE {v:.3f}; no candidate reached MASE {threshold:g}, "
                      + ("it is a member of the no-skill average" if m in average
                         else "the no-skill average is forecast"))
        elif m not in eligible and bar is not None:  # scored, not eligible: there is a bar
            out[m] = f"not selected: MASE {v:.3f} is worse than the seasonal naive {bar[0]} ({bar[1]:.3f})"
        elif best is not None and v > best * (1 + tolerance):
            out[m] = f"not selected: MASE {v:.3f}, more than {tolerance:.0%} above the best ({best:.3f})"
        else:
            out[m] = f"not selected: MASE {v:.3f} is within {tolerance:.0%} of the best, but later in the order"
    if chosen == AVERAGE:
        out[AVERAGE] = f"selected: no candidate reached MASE {threshold:g}; the average of " + "+".join(average)
    return out


@dataclass
class Selection:
    """What the backtest scores select: `model` (AVERAGE under the no-skill rule), the scored
    models by preference (`ranked`; the order to fall back along), the no-skill `average`'s members
    ([] when some model showed skill), and `why` per model."""

    model: Optional[str]
    ranked: list[str] = field(default_factory=list)
    average: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)


def select(skill: dict[str, dict], order, tolerance: float, average_below_skill: float) -> Selection:
    """The selection rule (module docstring) on the pooled backtest scores `skill` of the models in
    `order` (the configured candidates, best first; models without a score are skipped)."""
    scored = [m for m in order if m in skill]
    ranked = rank_models(skill, scored, tolerance)
    average = no_skill_members(skill, order, average_below_skill)
    model = AVERAGE if average else (ranked[0] if ranked else None)
    return Selection(model, ranked, average,
                     selection_reasons(skill, scored, tolerance, model, average, average_below_skill))


# --- combinations' and the average's folds, without refits --------------------------------------

def average_folds(members, fold_sets: dict[str, list[Fold]], name: str) -> Optional[list[Fold]]:
    """Backtest folds of the equal-weight average of `members`, averaged from their folds (no
    refits), when every member was backtested at the same origins; None otherwise."""
    if not members or any(m not in fold_sets for m in members):
        return None
    sets = [fold_sets[m] for m in members]
    if len({tuple(f.origin for f in fs) for fs in sets}) != 1:
        return None
    return [Fold(group[0].origin, combine([f.forecast for f in group], name), group[0].actual,
                 group[0].observed) for group in zip(*sets)]


def combined_folds(name: str, fold_sets: dict[str, list[Fold]]) -> Optional[list[Fold]]:
    """A combination's backtest folds averaged from its members' folds (no refits); None when a
    member is missing or was backtested elsewhere (then it is backtested itself)."""
    return average_folds(getattr(get_model(name), "members", None), fold_sets, name)


def members_last(names) -> list[str]:
    """The models in the given order, combinations moved after every plain model, so that their
    folds can be averaged from their members'."""
    return sorted(names, key=lambda m: hasattr(get_model(m), "members"))
