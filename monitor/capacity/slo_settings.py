"""The `slos:` section and a pool's `slo:` mapping, read into monitor.capacity.slo's typed targets.

    slos:
      objective: 0.95                  # the objective of a target given as `seconds:`
      windows: [5m, 1h, 6h]            # burn-rate windows (default: the SRE-workbook pairs)
      task_types: {email: {p95_seconds: 30}, chat: {seconds: 5}}
      default: {p99_seconds: 120}      # every other task type
      pools: {chat-8b: {ttft_p95_seconds: 0.5, e2e_p99_seconds: 20}}
    pools:
      chat-8b: {slo: {ttft_p95_seconds: 0.5}}   # the same pool targets, next to the pool's settings

The file's words stay the user's (`p95_seconds`); what the capacity layer receives is `Target`s.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from monitor.capacity.slo import SIGNALS, SloSettings, Target
from monitor.kit.settings.kinds import Kind, Number
from monitor.kit.settings.reader import Reader, key
from monitor.kit.settings.shapes import MapOf
from monitor.kit.settings.values import parse_duration, type_name

_TASK_KEY = re.compile(r"^p(\d+(?:\.\d+)?)_seconds$")
_POOL_KEY = re.compile(rf"^({'|'.join(SIGNALS)})_p(\d+(?:\.\d+)?)_seconds$")


def _objective(quantile: str) -> float:
    q = float(quantile) / 100.0
    if not 0 < q < 1:
        raise ValueError(f"p{quantile} is not a quantile between p0 and p100")
    return q


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"expected a number of seconds > 0, got {v!r}")
    return float(v)


class TaskTarget(Kind):
    """{pNN_seconds: S} or {seconds: S}; the second takes the section's objective (None until then)."""

    name = "mapping like {p95_seconds: 30} or {seconds: 30}"

    def read(self, r: Reader, value: Any, at: str) -> tuple[float, Optional[float]]:
        if not isinstance(value, dict):
            raise r.fail(at, f"expected a mapping like {{p95_seconds: 30}}, got {type_name(value)}")
        if len(value) != 1:
            raise r.fail(at, f"give exactly one of seconds or pNN_seconds, got {sorted(map(str, value))}")
        (k, v), = value.items()
        m = _TASK_KEY.match(str(k))
        if str(k) != "seconds" and not m:
            raise r.fail(f"{at}.{k}", "not like p95_seconds (or seconds)")
        try:
            return _seconds(v), (_objective(m.group(1)) if m else None)
        except ValueError as exc:
            raise r.fail(f"{at}.{k}", str(exc)) from None


class PoolTargets(Kind):
    """{ttft_p95_seconds: 0.5, e2e_p99_seconds: 20, ...} -> [Target]."""

    name = f"mapping like {{ttft_p95_seconds: 0.5}} (signals {', '.join(SIGNALS)})"

    def read(self, r: Reader, value: Any, at: str) -> list[Target]:
        if not isinstance(value, dict):
            raise r.fail(at, f"expected a mapping like {{ttft_p95_seconds: 0.5}}, got {type_name(value)}")
        out = []
        for k, v in value.items():
            m = _POOL_KEY.match(str(k))
            if not m:
                raise r.fail(f"{at}.{k}", f"not like ttft_p95_seconds or e2e_p99_seconds (signals {', '.join(SIGNALS)})")
            try:
                out.append(Target(_seconds(v), _objective(m.group(2)), m.group(1)))
            except ValueError as exc:
                raise r.fail(f"{at}.{k}", str(exc)) from None
        return out


class Windows(Kind):
    """A non-empty list of durations, each kept under the name the user wrote (`5m`)."""

    name = "list of durations"

    def read(self, r: Reader, value: Any, at: str) -> dict[str, float]:
        if not isinstance(value, list) or not value:
            raise r.fail(at, f"expected a non-empty list like [5m, 1h], got {value!r}")
        out = {}
        for i, w in enumerate(value):
            try:
                secs = parse_duration(w)
            except ValueError as exc:
                raise r.fail(f"{at}[{i}]", str(exc)) from None
            if not secs > 0:
                raise r.fail(f"{at}[{i}]", f"must be > 0, got {w!r}")
            out[str(w)] = secs
        return out

    def show(self, value: Any) -> str:
        return "[" + ", ".join(value) + "]"


@dataclass(frozen=True)
class Slos:
    objective: float = key(Number(gt=0, lt=1), 0.95, help="objective of a target given as seconds:")
    windows: dict[str, float] = key(Windows(), SloSettings().windows,
                                    help="burn-rate windows (the bundled alerts use 1m, 5m, 30m, 1h, 2h, 6h, 1d, 3d)")
    task_types: dict[str, tuple] = key(MapOf(TaskTarget(), names="task type"), {},
                                       help="task completion target per task type, e.g. {p95_seconds: 30}")
    default: Optional[tuple] = key(TaskTarget(), help="task completion target of every other task type")
    pools: dict[str, list] = key(MapOf(PoolTargets(), names="pool"), {},
                                 help="pool targets, e.g. {ttft_p95_seconds: 0.5} (as pools.<pool>.slo)")

    def settings(self) -> SloSettings:
        def target(spec: tuple) -> Target:
            seconds, objective = spec
            return Target(seconds, self.objective if objective is None else objective, "task")
        return SloSettings(task_targets={tt: target(s) for tt, s in self.task_types.items()},
                           default_task_target=target(self.default) if self.default else None,
                           pool_targets={p: list(ts) for p, ts in self.pools.items()}, windows=dict(self.windows))


class SloSection(Kind):
    """`slos:` read whole into `SloSettings`."""

    name = "mapping"

    def read(self, r: Reader, value: Any, at: str) -> SloSettings:
        return r.section(Slos, value, at).settings()

    def show(self, value: Any) -> str:
        return ""

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return [(prefix, Slos, "")]


def read_slos(data: Any, file: str = "<config>") -> SloSettings:
    """A `slos:` mapping on its own (the demo's targets), read as the configuration reads it."""
    return Reader(file).section(Slos, data, "slos").settings()
