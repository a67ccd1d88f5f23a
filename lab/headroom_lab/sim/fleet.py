"""The simulated fleet: pools of replicas behind a gateway, driven by the agent workload.

``Fleet`` is a discrete-event simulation on a simulated clock (epoch seconds). It is
deterministic for a given config, scenario and seed: ``Fleet.advance(seconds)`` fast-forwards.
The HTTP layer (``server.py``) advances it to wall-clock time from a background thread.

Gateway (Envoy AI Gateway style) and application metrics are recorded here, and so is the
ground truth of every finished task (``Fleet.truth``): duration including tool waits, number of
model calls (every gateway request of the task, retries included), failure.
"""
from __future__ import annotations

import heapq
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import yaml

from .engine import Histo, PoolParams, Replica, Request
from .workload import DEFAULT_TRACE, Mix, TaskType, TraceReplay, load_mix, parse_mix, profile_clock

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FLEET = os.path.join(HERE, "default_fleet.yaml")

# Envoy AI Gateway bucket bounds (internal/metrics/genai.go at d55d3206, metrics-reference §4.2)
GW_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                       40.96, 81.92)
GW_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
GW_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
GW_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                    16777216, 67108864)
# application convention (see README.md)
TASK_DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0,
                         300.0, 600.0, 1200.0, 1800.0, 3600.0)


@dataclass
class GatewayOptions:
    session_label: bool = False  # map agent-session-id -> session_id (high cardinality)
    task_type_label: bool = True  # map x-task-type -> task_type
    session_series_limit: int = 2000  # beyond this, series go to otel_metric_overflow="true"
    overhead_ms: float = 2.0
    provider: str = "openai"


@dataclass
class FleetConfig:
    pools: list[PoolParams]
    mix: Mix
    gateway: GatewayOptions = field(default_factory=GatewayOptions)
    replay: Optional[TraceReplay] = None
    seed: int = 1
    # scenario knobs (see scenarios below); any key can be overridden from YAML `scenarios:`
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)

    def pool(self, name: str) -> PoolParams:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool named {name!r} (pools: {[p.name for p in self.pools]})")


SCENARIO_DEFAULTS: dict[str, dict[str, Any]] = {
    # flat rates at `level` x rate_per_s of every task type
    "steady": {"level": 1.0, "profile": False},
    # flat at `level`, then x`multiplier` from `at_s` for `duration_s` (seconds after start)
    "burst": {"level": 0.7, "profile": False, "at_s": 10.0, "duration_s": 40.0, "multiplier": 3.0,
              "request_timeout_s": 0.0},
    # the mix profiles (hour-of-day, weekday, bursts); `day_seconds` < 86400 compresses a day;
    # `start_hour` (with `start_weekday`, 0 = Monday) pins the profile clock at the scenario
    # origin instead of following the real clock; `min_level` floors the profile value
    "diurnal": {"level": 1.0, "profile": True, "day_seconds": 86400.0, "start_hour": None,
                "start_weekday": 0, "min_level": 0.0},
    # `headroom demo`'s default: the diurnal profiles on a clock that starts on a Tuesday at
    # 09:00 (the morning burst begins), with the history (headroom_lab/sim/history.py) generated
    # on the same clock; `pool_levels` scales each pool's task rates so the weekday peaks sit at
    # the knee; a call that waits `request_timeout_s` in an engine queue is given up by its
    # client (0: never); `history_noise` is the day-to-day variation of the generated history
    # (the live fleet's own is the Poisson arrivals)
    "morning": {"level": 1.0, "profile": True, "day_seconds": 86400.0, "start_hour": 9.0,
                "start_weekday": 1, "min_level": 0.0, "pool_levels": {}, "request_timeout_s": 20.0,
                "history_noise": 0.03},
    # steady, then replica `replica` (default: the last of the first pool) stops at `at_s`
    "replica-loss": {"level": 0.8, "profile": False, "at_s": 30.0, "pool": None, "replica": None},
}


def pinned_start(sp: dict) -> float:
    """The profile clock at the origin of a scenario that pins it (`start_weekday`, `start_hour`):
    that weekday and hour of the first week of 1970 (only weekday and hour matter to the profiles)."""
    monday = 345600.0  # 1970-01-05 00:00 UTC, a Monday
    return monday + float(sp.get("start_weekday", 0)) * 86400.0 + float(sp["start_hour"]) * 3600.0


def load_config(path: Optional[str] = None, overrides: Optional[dict] = None) -> FleetConfig:
    """Read a fleet YAML (default: default_fleet.yaml next to this module)."""
    path = path or DEFAULT_FLEET
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ValueError(f"sim config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"sim config file {path} is not valid YAML: {exc}") from None
    if overrides:
        data = {**data, **overrides}
    return config_from_dict(data, base_dir=os.path.dirname(os.path.abspath(path)), where=path)


def config_from_dict(data: dict, base_dir: str = HERE, where: str = "sim config") -> FleetConfig:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping at the top level")
    known = {"pools", "mix", "mix_file", "gateway", "replay", "seed", "scenarios"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (known: {sorted(known)})")
    pools_raw = data.get("pools")
    if not isinstance(pools_raw, dict) or not pools_raw:
        raise ValueError(f"{where}: 'pools' must be a non-empty mapping of pool name -> parameters")
    pools = [PoolParams.from_dict(name, d or {}) for name, d in pools_raw.items()]
    if "mix" in data:
        mix = parse_mix(data["mix"], where=f"{where}: mix")
    else:
        mf = data.get("mix_file")
        mix = load_mix(os.path.join(base_dir, mf) if mf else None)
    names = {p.name for p in pools}
    for tt in mix.task_types.values():
        if tt.pool not in names:
            raise ValueError(f"{where}: task type {tt.name!r} routes to unknown pool {tt.pool!r} "
                             f"(pools: {sorted(names)})")
        for s in tt.steps:
            mml = next(p.max_model_len for p in pools if p.name == tt.pool)
            if s.prompt.max + s.output.max > mml:
                s.prompt.max = max(1, min(s.prompt.max, mml - s.output.max))
    gw = data.get("gateway") or {}
    try:
        gateway = GatewayOptions(**gw)
    except TypeError as exc:
        raise ValueError(f"{where}: gateway: {exc}") from None
    replay = None
    rp = data.get("replay")
    if rp:
        if not isinstance(rp, dict) or "pool" not in rp:
            raise ValueError(f"{where}: replay needs at least 'pool'")
        if rp["pool"] not in names:
            raise ValueError(f"{where}: replay routes to unknown pool {rp['pool']!r}")
        file = rp.get("file")
        path = DEFAULT_TRACE if not file else (file if os.path.isabs(file) else
                                               os.path.join(base_dir, file))
        if file and not os.path.exists(path):
            path = os.path.join(HERE, "data", file)
        mml = next(p.max_model_len for p in pools if p.name == rp["pool"])
        replay = TraceReplay(pool=rp["pool"], path=path, speed=float(rp.get("speed", 1.0)),
                             loop=bool(rp.get("loop", True)), max_model_len=mml).load()
    scen = {k: dict(v) for k, v in SCENARIO_DEFAULTS.items()}
    for name, over in (data.get("scenarios") or {}).items():
        if name not in scen:
            raise ValueError(f"{where}: unknown scenario {name!r} (known: {sorted(scen)})")
        scen[name].update(over or {})
    return FleetConfig(pools, mix, gateway, replay, int(data.get("seed", 1)), scen)


# ---------------------------------------------------------------------------- records
class Task:
    __slots__ = ("tid", "tt", "session_id", "start", "step", "pending", "calls", "failed",
                 "replay_row")

    def __init__(self, tid: int, tt: TaskType, session_id: str, start: float):
        self.tid = tid
        self.tt = tt
        self.session_id = session_id
        self.start = start
        self.step = 0
        self.pending = 0
        self.calls = 0
        self.failed = False
        self.replay_row = None


class Call:
    __slots__ = ("task", "prompt", "output", "attempt", "t_sent", "pool")

    def __init__(self, task: Task, prompt: int, output: int, pool: str):
        self.task = task
        self.prompt = prompt
        self.output = output
        self.attempt = 0
        self.t_sent = 0.0
        self.pool = pool


@dataclass
class TaskRecord:
    task_type: str
    session_id: str
    pool: str
    start: float
    end: float
    model_calls: int
    failed: bool
    task_class: str = "interactive"

    @property
    def duration(self) -> float:
        return self.end - self.start


def _get(d: dict, k: tuple, bounds) -> Histo:
    h = d.get(k)
    if h is None:
        h = d[k] = Histo(bounds)
    return h


class GatewayStats:
    """gen_ai_* histograms keyed by (pool, task_type, session_id or None, error flag)."""

    def __init__(self, opts: GatewayOptions):
        self.opts = opts
        self.duration: dict[tuple, Histo] = {}
        self.ttft: dict[tuple, Histo] = {}
        self.tpot: dict[tuple, Histo] = {}
        self.tokens: dict[tuple, Histo] = {}  # key + (token_type,)
        self.session_keys: set = set()
        self.requests_by_task_type: dict[str, int] = {}

    def _key(self, pool: str, task_type: str, session: str, error: bool) -> tuple:
        o = self.opts
        sess = session if o.session_label else None
        if sess is not None and sess not in self.session_keys:
            if len(self.session_keys) >= o.session_series_limit:
                sess = "__overflow__"
            else:
                self.session_keys.add(sess)
        return (pool, task_type if o.task_type_label else None, sess, error)

    def record(self, pool: str, task_type: str, session: str, duration: float,
               ttft: Optional[float], prompt: int, output: int, cached: int, error: bool):
        k = self._key(pool, task_type, session, error)
        self.requests_by_task_type[task_type] = self.requests_by_task_type.get(task_type, 0) + 1
        _get(self.duration, k, GW_DURATION_BUCKETS).observe(duration)
        if error:
            return
        if ttft is not None:
            _get(self.ttft, k, GW_TTFT_BUCKETS).observe(ttft)
            if output > 1:
                _get(self.tpot, k, GW_TPOT_BUCKETS).observe(max(0.0, duration - ttft) / (output - 1))
        _get(self.tokens, k + ("input",), GW_TOKEN_BUCKETS).observe(prompt)
        _get(self.tokens, k + ("output",), GW_TOKEN_BUCKETS).observe(output)
        if cached:
            _get(self.tokens, k + ("cached_input",), GW_TOKEN_BUCKETS).observe(cached)


class AppStats:
    """Application-side agent task metrics (agent_* convention, see README.md)."""

    def __init__(self, task_types):
        self.started = {t: 0 for t in task_types}
        self.active = {t: 0 for t in task_types}
        self.calls = {t: 0 for t in task_types}
        self.failed = {t: 0 for t in task_types}
        self.abandoned = {t: 0 for t in task_types}  # calls given up on (request_timeout_s)
        self.duration = {t: Histo(TASK_DURATION_BUCKETS) for t in task_types}

    def ensure(self, t: str) -> None:
        if t not in self.started:
            self.started[t] = self.active[t] = self.calls[t] = self.failed[t] = self.abandoned[t] = 0
            self.duration[t] = Histo(TASK_DURATION_BUCKETS)


# ---------------------------------------------------------------------------- fleet
class Fleet:
    def __init__(self, config: FleetConfig, scenario: str = "steady", seed: Optional[int] = None,
                 start_time: Optional[float] = None, record_truth: bool = True,
                 scenario_overrides: Optional[dict] = None,
                 scenario_origin: Optional[float] = None):
        if scenario not in config.scenarios:
            raise ValueError(f"unknown scenario {scenario!r} (choose from "
                             f"{', '.join(sorted(config.scenarios))})")
        self.config = config
        self.scenario = scenario
        self.sp = dict(config.scenarios[scenario])
        if scenario_overrides:
            unknown = set(scenario_overrides) - set(self.sp)
            if unknown:
                raise ValueError(f"scenario {scenario!r}: unknown setting(s) {sorted(unknown)}")
            self.sp.update(scenario_overrides)
        self.seed = config.seed if seed is None else seed
        self.rng = random.Random(self.seed)
        self.start = float(start_time if start_time is not None else time.time())
        self.t = self.start
        # scenario times (at_s, duration_s) count from here; start_fleet sets it to the moment
        # serving begins, after the warm-up
        self.origin = float(scenario_origin) if scenario_origin is not None else self.start
        self.pools: dict[str, list[Replica]] = {}
        for p in config.pools:
            self.pools[p.name] = [Replica(p, i, self.start) for i in range(p.replicas)]
        self.replicas: list[Replica] = [r for rs in self.pools.values() for r in rs]
        self._params = {p.name: p for p in config.pools}
        self._buffers: dict[int, list[int]] = {}
        self._alive = {name: list(rs) for name, rs in self.pools.items()}
        self.heap: list = []
        self.seq = 0
        self.rid = 0
        self.tid = 0
        self.rr = {name: 0 for name in self.pools}
        self.gateway = GatewayStats(config.gateway)
        names = list(config.mix.task_types)
        if config.replay:
            names.append(config.replay.task_type)
        self.app = AppStats(names)
        self.record_truth = record_truth
        self.truth: list[TaskRecord] = []
        self.events_processed = 0
        self.lost_replicas: list[Replica] = []
        for tt in config.mix.task_types.values():
            self._schedule_next_task(tt, self.start)
            for i in range(tt.sessions):  # closed population: staggered by 10 ms
                self._push(self.start + 0.01 * i, "T", tt, None)
        if config.replay:
            self._replay_type = TaskType(config.replay.task_type, config.replay.pool, 0.0,
                                         config.mix.profiles.get("flat"), [], "interactive")
            self._push(self.start + config.replay.rows[0].offset_s / config.replay.speed,
                       "P", 0, 0)
        if scenario == "replica-loss":
            pool = self.sp.get("pool") or config.pools[0].name
            if pool not in self.pools:
                raise ValueError(f"replica-loss: unknown pool {pool!r}")
            idx = self.sp.get("replica")
            idx = len(self.pools[pool]) - 1 if idx is None else int(idx)
            if not 0 <= idx < len(self.pools[pool]):
                raise ValueError(f"replica-loss: pool {pool!r} has no replica {idx}")
            self._push(self.origin + float(self.sp["at_s"]), "X", self.pools[pool][idx], None)

    # ------------------------------------------------------------------ event plumbing
    def _push(self, t: float, kind: str, a: Any, b: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("cannot advance by a negative duration")
        self.advance_to(self.t + seconds)

    def advance_to(self, t_end: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= t_end:
            t, _, kind, a, b = heapq.heappop(heap)
            self.events_processed += 1
            if kind == "B":
                if a.version != b or not a.alive:
                    continue
                nt, done = a.boundary(t)
                for req in done:
                    self._call_done(req, t)
                if nt is not None:
                    self._push(nt, "B", a, a.version)
            elif kind == "T":
                self._start_task(a, t)
            elif kind == "S":
                self._run_step(a, t)
            elif kind == "R":
                self._send(a, t)
            elif kind == "P":
                self._replay(a, b, t)
            elif kind == "X":
                self._kill(a, t)
            elif kind == "A":
                self._timed_out(a, b, t)
        if t_end > self.t:
            self.t = t_end

    # ------------------------------------------------------------------ rates
    def rate_multiplier(self, t: float, tt: TaskType) -> float:
        sp = self.sp
        m = float(sp.get("level", 1.0)) * float((sp.get("pool_levels") or {}).get(tt.pool, 1.0))
        if sp.get("profile"):
            wd, hr = self.profile_time(t)
            m *= max(float(sp.get("min_level", 0.0)), tt.profile.value(wd, hr))
        if self.scenario == "burst":
            rel = t - self.origin
            if sp["at_s"] <= rel < sp["at_s"] + sp["duration_s"]:
                m *= float(sp["multiplier"])
        return m

    def profile_time(self, t: float) -> tuple[int, float]:
        """(weekday 0=Mon, hour of day) the mix profiles see at simulated time t: the real
        clock (plus the mix's utc_offset_hours), or, with the scenario knob ``start_hour``, a
        clock that reads ``start_weekday`` (default Monday) ``start_hour`` at the scenario
        origin. ``day_seconds`` < 86400 makes it run faster."""
        sp = self.sp
        day = float(sp.get("day_seconds", 86400.0))
        if sp.get("start_hour") is None:
            return profile_clock(t, self.start, day, self.config.mix.utc_offset_hours)
        pc = pinned_start(sp) + (t - self.origin) * (86400.0 / day)
        return profile_clock(pc, pc, 86400.0)

    def _segment_end(self, t: float) -> float:
        """Rates are piecewise constant over 60 s segments (and scenario edges)."""
        rel = t - self.start
        end = self.start + (math.floor(rel / 60.0) + 1) * 60.0
        if self.scenario == "burst":
            for edge in (self.sp["at_s"], self.sp["at_s"] + self.sp["duration_s"]):
                e = self.origin + edge
                if t < e < end:
                    end = e
        if self.sp.get("profile") and float(self.sp.get("day_seconds", 86400.0)) < 86400.0:
            seg = max(1.0, float(self.sp["day_seconds"]) / 1440.0)  # one profile-minute
            end = min(end, self.start + (math.floor(rel / seg) + 1) * seg)
        return end

    def _schedule_next_task(self, tt: TaskType, t: float) -> None:
        if tt.rate_per_s <= 0:
            return
        horizon = t + 400 * 86400.0
        while t < horizon:
            rate = tt.rate_per_s * self.rate_multiplier(t, tt)
            end = self._segment_end(t)
            if rate > 0:
                dt = self.rng.expovariate(rate)
                if t + dt < end:
                    self._push(t + dt, "T", tt, None)
                    return
            t = end

    # ------------------------------------------------------------------ tasks and calls
    def _new_task(self, tt: TaskType, t: float) -> Task:
        self.tid += 1
        sid = f"{tt.name[:3]}-{self.seed}-{self.tid:07d}"
        task = Task(self.tid, tt, sid, t)
        self.app.ensure(tt.name)
        self.app.started[tt.name] += 1
        self.app.active[tt.name] += 1
        return task

    def _start_task(self, tt: TaskType, t: float) -> None:
        self._schedule_next_task(tt, t)
        task = self._new_task(tt, t)
        self._run_step(task, t)

    def _run_step(self, task: Task, t: float) -> None:
        tt = task.tt
        step = tt.steps[task.step]
        pool = self._params[tt.pool]
        task.pending = step.calls
        for _ in range(step.calls):
            out = min(self._draw(step.output), pool.max_model_len - 1)
            prompt = self._draw(step.prompt)
            prompt = max(1, min(prompt, pool.max_model_len - out))
            self._send(Call(task, prompt, out, tt.pool), t)

    def _draw(self, dist) -> int:
        """One token count from ``dist``; drawn 512 at a time with numpy (seeded from this
        fleet's RNG, so runs stay deterministic and fleets sharing a config stay independent)."""
        buf = self._buffers.get(id(dist))
        if not buf:
            g = np.random.default_rng(self.rng.getrandbits(63))
            if dist.sigma == 0:
                vals = np.full(512, dist.mean)
            else:
                vals = g.lognormal(dist.mu, dist.sigma, 512)
            buf = np.clip(np.rint(vals), dist.min, dist.max).astype(int).tolist()
            buf.reverse()
            self._buffers[id(dist)] = buf
        return buf.pop()

    def _replay(self, idx: int, loop_no: int, t: float) -> None:
        rp = self.config.replay
        row = rp.rows[idx]
        task = self._new_task(self._replay_type, t)
        task.pending = 1
        mml = rp.max_model_len or 10 ** 9
        out = min(row.output, mml - 1)
        prompt = max(1, min(row.prompt, mml - out))
        self._send(Call(task, prompt, out, rp.pool), t)
        nxt, nloop = idx + 1, loop_no
        if nxt >= len(rp.rows):
            if not rp.loop:
                return
            nxt, nloop = 0, loop_no + 1
        t_next = self.start + (nloop * rp.span_s + rp.rows[nxt].offset_s) / rp.speed
        self._push(max(t, t_next), "P", nxt, nloop)

    def _pick(self, pool: str) -> Optional[Replica]:
        """Least loaded (running + waiting) live replica; ties rotate round-robin."""
        alive = self._alive[pool]
        n = len(alive)
        if not n:
            return None
        start = self.rr[pool] % n
        self.rr[pool] += 1
        best = alive[start]
        best_load = len(best.running) + len(best.waiting)
        for i in range(1, n):
            r = alive[(start + i) % n]
            load = len(r.running) + len(r.waiting)
            if load < best_load:
                best, best_load = r, load
        return best

    def _send(self, call: Call, t: float) -> None:
        task = call.task
        task.calls += 1
        call.t_sent = t
        tt = task.tt
        replica = self._pick(call.pool)
        if replica is None or (tt.error_rate > 0 and self.rng.random() < tt.error_rate) or not replica.admits():
            self._call_failed(call, t, t + 0.005)
            return
        self.rid += 1
        req = Request(self.rid, t, call.prompt, call.output, tt.prefix_key, tt.prefix_tokens,
                      call, max_tokens=max(call.output, int(call.output * tt.max_tokens_factor)))
        nt = replica.enqueue(req, t)
        if nt is not None:
            self._push(nt, "B", replica, replica.version)
        timeout = float(self.sp.get("request_timeout_s") or 0.0)
        if timeout > 0:
            self._push(t + timeout, "A", replica, req)

    def _timed_out(self, replica: Replica, req: Request, t: float) -> None:
        """The client gave up on a call still queued after request_timeout_s: the call and its
        task fail (no retry: the agent reports the timeout)."""
        if not replica.abandon(req):
            return
        call: Call = req.tag
        task = call.task
        self.gateway.record(call.pool, task.tt.name, task.session_id, t - call.t_sent, None,
                            call.prompt, 0, 0, error=True)
        self.app.abandoned[task.tt.name] += 1
        task.failed = True
        self._call_finished(task, t)

    def _call_failed(self, call: Call, t_start: float, t_fail: float) -> None:
        task = call.task
        self.gateway.record(call.pool, task.tt.name, task.session_id, t_fail - t_start, None,
                            call.prompt, 0, 0, error=True)
        if call.attempt < task.tt.max_retries:
            call.attempt += 1
            self._push(t_fail + task.tt.backoff_s, "R", call, None)
        else:
            task.failed = True
            self._call_finished(task, t_fail)

    def _call_done(self, req: Request, t: float) -> None:
        call: Call = req.tag
        task = call.task
        overhead = self.config.gateway.overhead_ms / 1000.0
        ttft = (req.first_token - call.t_sent + overhead) if req.first_token is not None else None
        self.gateway.record(call.pool, task.tt.name, task.session_id, t - call.t_sent + overhead,
                            ttft, req.prompt, req.generated, req.first_cached, error=False)
        self._call_finished(task, t + overhead)

    def _call_finished(self, task: Task, t: float) -> None:
        task.pending -= 1
        if task.pending > 0:
            return
        tt = task.tt
        step = tt.steps[task.step] if tt.steps else None
        task.step += 1
        if not task.failed and task.step < len(tt.steps):
            wait = self.rng.expovariate(1.0 / step.tool_wait_s) if step.tool_wait_s > 0 else 0.0
            self._push(t + wait, "S", task, None)
            return
        name = tt.name
        if tt.sessions:  # closed population: this session starts its next task
            think = self.rng.expovariate(1.0 / tt.think_s) if tt.think_s > 0 else 0.0
            self._push(t + think, "T", tt, None)
        app = self.app
        app.active[name] -= 1
        if task.failed:
            app.failed[name] += 1
        else:
            app.duration[name].observe(t - task.start)
            app.calls[name] += task.calls
        if self.record_truth:
            self.truth.append(TaskRecord(name, task.session_id, tt.pool, task.start, t,
                                         task.calls, task.failed, tt.klass))

    def _kill(self, replica: Replica, t: float) -> None:
        if not replica.alive:
            return
        lost = replica.kill(t)
        self.lost_replicas.append(replica)
        self._alive[replica.pool] = [r for r in self.pools[replica.pool] if r.alive]
        for req in lost:
            self._call_failed(req.tag, req.tag.t_sent, t)

    # ------------------------------------------------------------------ views
    def pool_state(self, pool: str) -> dict[str, float]:
        rs = [r for r in self.pools[pool] if r.alive]
        return {
            "replicas_alive": len(rs),
            "running": sum(r.num_running for r in rs),
            "waiting": sum(r.num_waiting for r in rs),
            "kv_usage": (sum(r.used_blocks for r in rs) / sum(r.usable_blocks for r in rs))
            if rs else 0.0,
        }

    def truth_summary(self, since: Optional[float] = None,
                      until: Optional[float] = None) -> dict[str, dict[str, float]]:
        """Per task type, over tasks that finished in [since, until]: tasks, failed, mean and
        p50/p95 duration (s, tool waits included) of the successful ones, mean model calls."""
        groups: dict[str, list[TaskRecord]] = {}
        for rec in self.truth:
            if (since is None or rec.end >= since) and (until is None or rec.end <= until):
                groups.setdefault(rec.task_type, []).append(rec)
        out = {}
        for name, recs in sorted(groups.items()):
            ok = sorted(r.duration for r in recs if not r.failed)

            def q(p, ok=ok):
                return ok[min(len(ok) - 1, int(p * len(ok)))] if ok else float("nan")

            out[name] = {
                "tasks": float(len(recs)),
                "failed": float(sum(r.failed for r in recs)),
                "mean_duration_s": sum(ok) / len(ok) if ok else float("nan"),
                "p50_duration_s": q(0.5),
                "p95_duration_s": q(0.95),
                "mean_model_calls": sum(r.model_calls for r in recs) / len(recs),
            }
        return out

    def replica(self, name: str) -> Replica:
        for r in self.replicas:
            if r.name == name:
                return r
        raise KeyError(name)


# ---------------------------------------------------------------------------- the knee
def theoretical_knee(pool: PoolParams, workload: Any) -> dict[str, float]:
    """Concurrency per replica and per pool at which queueing starts, by construction.

    A replica runs at most ``max_num_seqs`` requests and at most as many as fit in its KV cache.
    A running call holds its prompt plus the tokens generated so far; averaged over time (long
    outputs stay longer) that is ``E[prompt*output + output^2/2] / E[output]`` tokens, plus half a
    block of rounding. So the KV bound is ``kv_capacity_tokens / footprint`` and the knee is
    ``min(max_num_seqs, KV bound)`` running requests per replica: beyond it new requests wait and
    queue time turns up. (Prefill compute can make short waits appear below the knee when many
    long prompts arrive at once; those clear within a few steps.)

    ``workload`` is a :class:`Mix` (statistics of the calls routed to this pool) or a mapping
    with ``prompt`` and ``output`` mean tokens (then footprint = prompt + output/2)."""
    if isinstance(workload, Mix):
        means = workload.pool_token_means(pool.name)
        footprint = means["kv_footprint"]
    elif isinstance(workload, dict) and "prompt" in workload and "output" in workload:
        means = workload
        footprint = float(means.get("kv_footprint",
                                    float(means["prompt"]) + float(means["output"]) / 2.0))
    else:
        raise ValueError("workload must be a Mix or a mapping with 'prompt' and 'output' means")
    footprint += pool.block_size / 2.0
    kv_bound = pool.kv_capacity_tokens / footprint
    per_replica = min(float(pool.max_num_seqs), kv_bound)
    return {
        "per_replica": per_replica,
        "pool": per_replica * pool.replicas,
        "bound": "max_num_seqs" if pool.max_num_seqs <= kv_bound else "kv_cache",
        "kv_bound_per_replica": kv_bound,
        "mean_kv_tokens_per_request": footprint,
    }
