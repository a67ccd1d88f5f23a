"""The forecast models' one interface and its shared pieces (pure: no I/O, no clocks).

`Model.fit(prepared) -> Fitted` (raises `TooShort` / `FitError`, never returns junk),
`Fitted.forecast(h) -> Forecast(mean, bands {0.8: (lo, hi), 0.95: ...})`; band helpers and the
constant fit every model returns on a flat series. The models themselves: monitor/forecast/naive.py
(seasonal naives) and monitor/forecast/statsmodels_models.py (Holt-Winters, MSTL, SARIMAX); the
registry: monitor/forecast/models.py.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from monitor.forecast.series import Prepared

LEVELS = (0.8, 0.95)
Z = {0.8: 1.2815515655446004, 0.95: 1.959963984540054}


class TooShort(ValueError):
    """History shorter than the model's minimum; the message says how much is needed."""


class FitError(RuntimeError):
    """The model could not be fitted on this series."""


@dataclass
class Forecast:
    mean: np.ndarray
    bands: dict[float, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    model: str = ""

    def lower(self, level: float) -> np.ndarray:
        return self.bands[level][0]

    def upper(self, level: float) -> np.ndarray:
        return self.bands[level][1]


def _clip_bands(mean: np.ndarray, bands: dict) -> dict:
    out = {}
    for level, (lo, hi) in bands.items():
        lo = np.minimum(np.maximum(lo, 0.0), mean)
        hi = np.maximum(hi, mean)
        out[level] = (lo, hi)
    return out


def _normal_bands(mean: np.ndarray, sigma: np.ndarray) -> dict:
    return _clip_bands(mean, {lv: (mean - Z[lv] * sigma, mean + Z[lv] * sigma) for lv in LEVELS})


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")
    return ctx


class Model:
    name = "model"

    def min_history(self, prep: Prepared) -> int:  # points
        raise NotImplementedError

    def check(self, prep: Prepared) -> None:
        need = self.min_history(prep)
        if prep.n < need:
            raise TooShort(f"{self.name} needs at least {need} points "
                           f"({need * prep.step / 3600:.1f} h), history has {prep.n}")

    def fit(self, prep: Prepared) -> "Fitted":
        raise NotImplementedError


class Fitted:
    model_name = "model"

    def forecast(self, h: int) -> Forecast:
        raise NotImplementedError


class _ConstantFit(Fitted):
    def __init__(self, name, value):
        self.model_name, self.value = name, value

    def forecast(self, h: int) -> Forecast:
        mean = np.full(h, self.value)
        return Forecast(mean, {lv: (mean.copy(), mean.copy()) for lv in LEVELS}, self.model_name)
