"""Weeks of fleet history in seconds, from an aggregate (fluid) model of the simulated fleet.

No request is replayed. Per pool and time step:

- task arrival rate of each task type = rate_per_s x level x profile(weekday, hour) x trend x noise
  (noise: multiplicative AR(1) lognormal, so it is smooth over minutes), call rate = sum over
  task types of task rate x calls per task;
- the pool serves like the engine does: per-call latency W(n) = prefill + mean output x step time
  at n running per replica (``step_base + step_per_seq*n + step_per_1k_kv*n*footprint/1000``);
  concurrency solves L = call_rate x W(L / replicas) (Little's law) up to the knee
  (:func:`headroom_lab.sim.fleet.theoretical_knee`); above it the running set is full, throughput is
  knee / W(knee) and the excess accumulates in a fluid queue that drains when load falls;
- KV tokens = running x KV footprint per call (capped at capacity); sessions = sum over task
  types of task rate x task duration (calls x W + tool waits).

Task types with a closed population (``sessions``) are not part of the history (it models
arrival rates only).

``generate_history`` returns a long pandas DataFrame (timestamp, pool, series, value, instance);
pool rows have instance "" and replica rows carry vLLM gauge names (the generator's own names: task
arrivals are counts per step, ``call_arrival_rate`` calls per second). ``schema_history`` turns it
into what headroom would have recorded, in the history schema's names and meanings
(monitor/model/schema.py). ``write_openmetrics`` writes the replica gauges, and optionally that
headroom history as headroom's exported metrics, as OpenMetrics text for
``promtool tsdb create-blocks-from openmetrics``.
"""
from __future__ import annotations

import math
import time
from typing import Optional, Union

import numpy as np
import pandas as pd

from .exposition import fmt
from .fleet import FleetConfig, load_config, pinned_start, theoretical_knee
from .workload import profile_clock

POOL_SERIES = ("call_arrival_rate", "active_requests", "queued_requests", "kv_tokens", "sessions")


def _profile_values(tt, ts: np.ndarray, utc_offset: float, shift: float = 0.0) -> np.ndarray:
    out = np.empty(len(ts))
    for i, t in enumerate(ts):
        wd, hr = profile_clock(float(t) + shift, float(t) + shift, 86400.0, utc_offset)
        out[i] = tt.profile.value(wd, hr)
    return out


def scenario_clock_shift(config: FleetConfig, scenario: Optional[str], origin: float) -> float:
    """Seconds to add to a wall time for the profile clock of ``scenario`` whose origin (the
    moment serving starts) is ``origin``: the shift the live fleet applies when the scenario pins
    its clock (``start_hour``, ``start_weekday``; see ``Fleet.profile_time``), else 0 (the mix's
    own ``utc_offset_hours`` still applies)."""
    sp = config.scenarios.get(scenario or "", {})
    if not sp.get("profile") or sp.get("start_hour") is None:
        return 0.0
    if float(sp.get("day_seconds", 86400.0)) != 86400.0:
        raise ValueError(f"scenario {scenario!r}: history needs a real-time day (day_seconds 86400)")
    # a whole number of weeks away from the origin, so only weekday and hour move
    shift = pinned_start(sp) - origin - config.mix.utc_offset_hours * 3600.0
    return shift - math.floor(shift / (7 * 86400.0)) * 7 * 86400.0


def _ar_noise(rng: np.random.Generator, n: int, sigma: float, phi: float = 0.95) -> np.ndarray:
    if sigma <= 0:
        return np.ones(n)
    eps = rng.normal(0.0, sigma * math.sqrt(1 - phi * phi), n)
    x = np.empty(n)
    acc = rng.normal(0.0, sigma)
    for i in range(n):
        acc = phi * acc + eps[i]
        x[i] = acc
    return np.exp(x - sigma * sigma / 2)


def _fluid_queue(call_rate: np.ndarray, mu_full: np.ndarray, conc: np.ndarray, cap: float, step_s: int,
                 patience: float) -> tuple[np.ndarray, np.ndarray]:
    """(running, queued) per step: above the knee the running set is full, throughput is `mu_full`
    and the excess waits in a fluid queue that drains when load falls; with `patience` > 0 queued
    clients give up at rate q / patience (q' = inflow - q / patience, solved exactly per step)."""
    n = len(call_rate)
    running = np.minimum(conc, cap)
    queued = np.zeros(n)
    q = 0.0
    keep = math.exp(-step_s / patience) if patience > 0 else 1.0
    for i in range(n):
        inflow = call_rate[i] - (mu_full[i] if (q > 0 or conc[i] >= cap) else call_rate[i])
        if patience > 0:
            q = max(0.0, q * keep + inflow * patience * (1.0 - keep))
        else:
            q = max(0.0, q + inflow * step_s)
        queued[i] = q
        if q > 0:
            running[i] = cap
    return running, queued


def _offered_measured(running: np.ndarray, queued: np.ndarray, service: np.ndarray, step_s: int,
                      patience: float) -> np.ndarray:
    """The offered load as headroom measures it (monitor/model.py `offered_requests`): active plus
    the arrivals not served, the clients giving up (q / patience) and the queue's growth, each
    holding the service time."""
    giveup = queued / patience if patience > 0 else np.zeros_like(queued)
    growth = np.maximum(0.0, np.diff(queued, prepend=queued[:1]) / step_s)
    return running + (giveup + growth) * service


def generate_history(config: Union[FleetConfig, str, None] = None, days: float = 14.0,
                     step_s: int = 60, end: Optional[float] = None, seed: int = 1,
                     level: float = 1.0, weekly_growth: float = 0.02, noise: float = 0.08,
                     replica_series: bool = True, scenario: Optional[str] = None,
                     origin: Optional[float] = None) -> pd.DataFrame:
    """History of every pool, ``days`` long at ``step_s`` resolution, ending at ``end``
    (default: 1 h before now, aligned to the step).

    With ``scenario`` (a profile scenario of the fleet config, e.g. ``morning``) the history is
    the past of that live scenario starting at ``origin`` (default ``end``): the same profile
    clock, ``level`` x ``pool_levels``, clients that give up after ``request_timeout_s`` in a
    queue, and the scenario's ``history_noise`` instead of ``noise``."""
    if not isinstance(config, FleetConfig):
        config = load_config(config)
    if days <= 0:
        raise ValueError(f"days must be > 0, got {days}")
    if not isinstance(step_s, int) or step_s < 1:
        raise ValueError(f"step_s must be an integer >= 1 second, got {step_s!r}")
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    if end is None:
        end = (int(time.time()) // step_s) * step_s - 3600
    n = int(days * 86400 // step_s)
    ts = end - step_s * np.arange(n - 1, -1, -1, dtype=np.float64)
    rng = np.random.default_rng(seed)
    sp = config.scenarios.get(scenario, {}) if scenario else {}
    if scenario and not sp:
        raise ValueError(f"unknown scenario {scenario!r} (choose from {', '.join(sorted(config.scenarios))})")
    if scenario and not sp.get("profile"):
        raise ValueError(f"scenario {scenario!r} has no daily profile: history needs one")
    shift = scenario_clock_shift(config, scenario, float(end if origin is None else origin))
    level = level * float(sp.get("level", 1.0))
    noise = float(sp.get("history_noise", noise))
    patience = float(sp.get("request_timeout_s") or 0.0)
    weeks = (ts - ts[0]) / (7 * 86400.0)
    trend = (1.0 + weekly_growth) ** weeks
    mix = config.mix
    frames = []
    for pool in config.pools:
        knee = theoretical_knee(pool, mix)
        per_rep_knee = knee["per_replica"]
        footprint = knee["mean_kv_tokens_per_request"]
        means = mix.pool_token_means(pool.name)
        out_mean, prompt_mean = means["output"], means["prompt"]
        call_rate = np.zeros(n)
        task_rates = {}
        for tt in mix.task_types.values():
            if tt.pool != pool.name or tt.rate_per_s <= 0:
                continue
            prof = _profile_values(tt, ts, mix.utc_offset_hours, shift)
            pool_level = float((sp.get("pool_levels") or {}).get(pool.name, 1.0))
            r = tt.rate_per_s * level * pool_level * prof * trend * _ar_noise(rng, n, noise)
            task_rates[tt.name] = (tt, r)
            call_rate += r * tt.calls_per_task

        # prefill work per call: the prompt minus the shared prefix the prefix cache keeps warm
        w_sum = sum(tt.rate_per_s * tt.calls_per_task for tt in mix.task_types.values()
                    if tt.pool == pool.name)
        prefix = (sum(tt.rate_per_s * tt.calls_per_task * tt.prefix_tokens
                      for tt in mix.task_types.values() if tt.pool == pool.name) / w_sum
                  if (w_sum and pool.enable_prefix_caching) else 0.0)
        prefill_tokens = max(1.0, prompt_mean - prefix)
        # share of GPU time spent on prefill (chunked prefill slows every decode step)
        rho_p = np.minimum(0.95, call_rate / pool.replicas * prefill_tokens
                           * pool.prefill_per_1k_ms / 1e6)

        def latency(nrep, rho=rho_p):  # seconds per call at n running per replica
            step = (pool.step_base_ms + pool.step_per_seq_ms * nrep
                    + pool.step_per_1k_kv_ms * nrep * footprint / 1000.0) / 1000.0
            return prefill_tokens * pool.prefill_per_1k_ms / 1e6 + out_mean * step / (1.0 - rho)

        conc = call_rate * latency(1.0)
        for _ in range(30):  # fixed point of L = lambda * W(L / replicas)
            conc = call_rate * latency(np.minimum(conc / pool.replicas, per_rep_knee))
        cap = per_rep_knee * pool.replicas
        mu_full = cap / latency(per_rep_knee, np.minimum(rho_p, 0.95))
        # the number in service fluctuates around Little's law (Poisson-like, damped)
        offered_true = conc.copy()  # every arrival served at once: the demand the forecasts are about
        conc = np.maximum(0.0, conc + rng.normal(0, 1, n) * np.sqrt(np.maximum(conc, 0)) * 0.3)
        running, queued = _fluid_queue(call_rate, mu_full, conc, cap, step_s, patience)
        offered = _offered_measured(running, queued, latency(np.minimum(running / pool.replicas, per_rep_knee)),
                                    step_s, patience)
        kv_tokens = np.minimum(running * footprint, pool.kv_capacity_tokens * pool.replicas)
        sessions = np.zeros(n)
        for tt, r in task_rates.values():
            w = latency(np.minimum(running / pool.replicas, per_rep_knee), rho_p)
            dur = sum(w + s.tool_wait_s for s in tt.steps)
            sessions += r * dur
            frames.append(pd.DataFrame({"timestamp": ts, "pool": pool.name,
                                        "series": f"task_arrivals:{tt.name}",
                                        "value": rng.poisson(r * step_s).astype(float),
                                        "instance": ""}))
        for name, vals in (("call_arrival_rate", call_rate), ("active_requests", running),
                           ("queued_requests", queued), ("kv_tokens", kv_tokens),
                           ("sessions", sessions), ("offered_requests", offered),
                           ("offered_true", offered_true)):
            frames.append(pd.DataFrame({"timestamp": ts, "pool": pool.name, "series": name,
                                        "value": vals, "instance": ""}))
        if replica_series:
            share = rng.dirichlet(np.full(pool.replicas, 40.0), size=n)  # uneven balancing
            for i in range(pool.replicas):
                inst = f"{pool.name}-{i}"
                run_i = np.minimum(np.round(running * share[:, i]), pool.max_num_seqs)
                wait_i = np.round(queued * share[:, i])
                kv_i = np.minimum(1.0, kv_tokens * share[:, i] / pool.kv_capacity_tokens)
                for name, vals in (("vllm:num_requests_running", run_i),
                                   ("vllm:num_requests_waiting", wait_i),
                                   ("vllm:kv_cache_usage_perc", np.round(kv_i, 5))):
                    frames.append(pd.DataFrame({"timestamp": ts, "pool": pool.name,
                                                "series": name, "value": vals, "instance": inst}))
    df = pd.concat(frames, ignore_index=True)
    df.attrs["step_s"] = step_s
    df.attrs["end"] = float(end)
    return df


def schema_history(df: pd.DataFrame, config: Union[FleetConfig, str, None] = None) -> pd.DataFrame:
    """What headroom would have recorded from this fleet, in the history schema: a long DataFrame
    (timestamp, pool, series, value), pools named by their ``model_name`` as headroom pools them.
    Requests and KV tokens are summed over the replica rows when ``df`` has them (as headroom derives
    them from the replicas' gauges), else taken from the pool rows; ``load`` = active + queued;
    ``arrival_rate`` = the call rate; ``task_arrivals:<type>`` in tasks per second."""
    from monitor.model.schema import key
    if not isinstance(config, FleetConfig):
        config = load_config(config)
    pools = {p.name: p for p in config.pools}
    step = float(df.attrs.get("step_s") or np.min(np.diff(np.unique(df["timestamp"].to_numpy()))))
    rows = df[df["instance"] == ""]
    wide = rows.pivot_table(index=["pool", "timestamp"], columns="series", values="value", aggfunc="first")
    rep = df[df["instance"] != ""]
    if not rep.empty:
        cap = rep["pool"].map({n: float(p.num_gpu_blocks * p.block_size) for n, p in pools.items()})
        rep = rep.assign(value=np.where(rep["series"] == "vllm:kv_cache_usage_perc", rep["value"] * cap, rep["value"]))
        sums = rep.groupby(["pool", "timestamp", "series"])["value"].sum().unstack("series")
        wide = wide.assign(active_requests=sums["vllm:num_requests_running"],
                           queued_requests=sums["vllm:num_requests_waiting"],
                           kv_tokens=sums["vllm:kv_cache_usage_perc"])
    out = {"active_requests": wide["active_requests"], "queued_requests": wide["queued_requests"],
           "load": wide["active_requests"] + wide["queued_requests"], "kv_tokens": wide["kv_tokens"],
           "sessions": wide["sessions"], "arrival_rate": wide["call_arrival_rate"]}
    if "offered_requests" in wide.columns:
        out["offered"] = wide["offered_requests"]
    for col in wide.columns:
        if str(col).startswith("task_arrivals:"):
            out[key("task_arrivals", str(col).split(":", 1)[1])] = wide[col] / step
    frames = []
    for name, values in out.items():
        v = values.dropna()
        frames.append(pd.DataFrame({"timestamp": v.index.get_level_values("timestamp").to_numpy(float),
                                    "pool": v.index.get_level_values("pool").map(lambda n: pools[n].model_name),
                                    "series": name, "value": v.to_numpy(float)}))
    return pd.concat(frames, ignore_index=True).sort_values(["pool", "series", "timestamp"], ignore_index=True)


def _headroom_families(history: pd.DataFrame):
    """OpenMetrics families of headroom's exported metrics for a ``schema_history`` frame."""
    from monitor.model.schema import SERIES, TASK_LABEL
    base = history["series"].str.split(":", n=1).str[0]
    for name, spec in SERIES.items():
        sub = history[base == name]
        if spec.metric is None or sub.empty:
            continue
        lines = [f"# TYPE {spec.metric} gauge\n"]
        for (pool, series), g in sub.groupby(["pool", "series"], sort=True):
            lab = f'pool="{pool}"' + (f',{TASK_LABEL}="{series.split(":", 1)[1]}"' if spec.per_task else "")
            g = g.sort_values("timestamp")
            lines.extend(f"{spec.metric}{{{lab}}} {fmt(v)} {int(t)}\n"
                         for t, v in zip(g["timestamp"].to_numpy(), g["value"].to_numpy()))
        yield lines


def write_openmetrics(df: pd.DataFrame, path: str, config: Union[FleetConfig, str, None] = None,
                      job: str = "vllm", headroom: Optional[pd.DataFrame] = None) -> int:
    """Write the replica-level vLLM gauges of ``df`` (plus ``vllm:cache_config_info``) as
    OpenMetrics text ending in ``# EOF``; with ``headroom`` (a ``schema_history`` frame, possibly
    cut in time) also headroom's exported metrics for it, labelled by pool as Prometheus would have
    scraped them. Returns the number of samples written."""
    if not isinstance(config, FleetConfig):
        config = load_config(config)
    pools = {p.name: p for p in config.pools}
    rep = df[df["instance"] != ""]
    if rep.empty:
        raise ValueError("history has no replica-level series (generate with replica_series=True)")
    helps = {
        "vllm:num_requests_running": "Number of requests in model execution batches.",
        "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
        "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    }
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for name, help_text in helps.items():
            f.write(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
            sub = rep[rep["series"] == name]
            for (pool, inst), g in sub.groupby(["pool", "instance"], sort=True):
                model = pools[pool].model_name
                lab = f'engine="0",instance="{inst}",job="{job}",model_name="{model}"'
                g = g.sort_values("timestamp")
                lines = [f"{name}{{{lab}}} {fmt(v)} {int(t)}\n"
                         for t, v in zip(g["timestamp"].to_numpy(), g["value"].to_numpy())]
                f.writelines(lines)
                count += len(lines)
        name = "vllm:cache_config_info"
        f.write(f"# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge\n")
        ts = np.sort(rep["timestamp"].unique())
        for (pool, inst), _ in rep.groupby(["pool", "instance"], sort=True):
            p = pools[pool]
            lab = (f'block_size="{p.block_size}",engine="0",instance="{inst}",job="{job}",'
                   f'kv_cache_size_tokens="{p.num_gpu_blocks * p.block_size}",'
                   f'model_name="{p.model_name}",num_gpu_blocks="{p.num_gpu_blocks}"')
            f.writelines(f"{name}{{{lab}}} 1.0 {int(t)}\n" for t in ts)
            count += len(ts)
        for lines in (_headroom_families(headroom) if headroom is not None else ()):
            f.writelines(lines)
            count += len(lines) - 1
        f.write("# EOF\n")
    return count


def pool_series(df: pd.DataFrame, pool: str, series: str) -> pd.Series:
    """One pool-level series as a pandas Series indexed by UTC timestamps."""
    sub = df[(df["pool"] == pool) & (df["series"] == series) & (df["instance"] == "")]
    if sub.empty:
        raise KeyError(f"no series {series!r} for pool {pool!r}")
    return pd.Series(sub["value"].to_numpy(),
                     index=pd.to_datetime(sub["timestamp"].to_numpy(), unit="s", utc=True),
                     name=f"{pool}/{series}")
