"""One simulated vLLM replica: continuous batching with a paged KV cache, in simulated time.

What it models (the parts that matter for capacity):

- at most ``max_num_seqs`` requests run; a waiting request is admitted (FCFS, no skipping) only
  when all KV blocks for its prompt fit in the free pool and a running slot is free;
- the KV cache has ``num_gpu_blocks`` blocks of ``block_size`` tokens, one of them the null block
  (so usage = used / (num_gpu_blocks - 1), as in vLLM's ``block_pool.get_usage``); a request holds
  ``ceil(tokens / block_size)`` blocks (no block sharing between requests);
- each step computes one token for every decoding request; when a step needs a new block and none
  is free, the newest running request is preempted (recompute: its blocks are freed, it goes back
  to the front of the waiting queue and later re-prefills prompt + generated tokens);
- prefill is chunked with a per-step token budget (``max_num_batched_tokens`` minus the decode
  tokens of the step); prefix caching (optional) saves the compute of a shared prompt prefix;
- a step takes ``step_base_ms + step_per_seq_ms * seqs + step_per_1k_kv_ms * kv_tokens / 1000 +
  prefill_per_1k_ms * prefill_tokens / 1000`` milliseconds.

Speed: between events (a completion, an admissible arrival, a full KV cache) a run of decode
steps changes the state uniformly, so the replica jumps over ``k`` steps at once (step times grow
linearly with the KV tokens, so the total has a closed form). A jump is cut short when an arrival
could be admitted earlier. Block crossings are tracked per residue of the step counter modulo
``block_size``, so a jump costs O(block_size) whatever the batch size.
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, fields
from typing import Any, Optional

import numpy as np

# vLLM 0.33 default histogram bounds (vllm/v1/metrics/buckets.py, metrics-reference §1.3)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series capped at max_model_len (1024 -> 1, 2, 5, ..., 500, 1000)."""
    out: list[float] = []
    mantissa, exponent = (1, 2, 5), 0
    while True:
        for m in mantissa:
            v = m * 10 ** exponent
            if v > max_model_len:
                return tuple(out)
            out.append(float(v))
        exponent += 1


class Histo:
    """Histogram accumulator. Observations are buffered and binned in bulk with numpy when the
    histogram is read (``counts``, ``sum``, ``count``, ``cumulative()``), which keeps the cost
    per simulated request and per engine step low."""

    __slots__ = ("bounds", "_counts", "_sum", "_count", "_pending", "_pend_w", "_pend_lin",
                 "_np_bounds")

    def __init__(self, bounds):
        self.bounds = tuple(float(b) for b in bounds)
        self._np_bounds = np.asarray(self.bounds, dtype=np.float64)
        self._counts = [0] * (len(self.bounds) + 1)  # non-cumulative; last = +Inf overflow
        self._sum = 0.0
        self._count = 0
        self._pending: list[float] = []  # single observations
        self._pend_w: list[tuple[float, int]] = []  # (value, times)
        self._pend_lin: list[tuple[float, float, int, int]] = []  # (first, step, k, weight)

    def observe(self, value: float, times: int = 1) -> None:
        if times == 1:
            self._pending.append(value)
            if len(self._pending) >= 8192:
                self._flush()
        elif times > 0:
            self._pend_w.append((value, times))
            if len(self._pend_w) >= 8192:
                self._flush()

    def observe_linear(self, first: float, step: float, k: int, weight: int = 1) -> None:
        """Observe first, first+step, ..., first+(k-1)*step (step >= 0), each ``weight`` times."""
        if k <= 0 or weight <= 0:
            return
        if step <= 0:
            self.observe(first, k * weight)
            return
        self._pend_lin.append((first, step, k, weight))
        if len(self._pend_lin) >= 8192:
            self._flush()

    def _bin(self, vals: np.ndarray, weights: Optional[np.ndarray] = None) -> None:
        idx = np.searchsorted(self._np_bounds, vals, side="left")
        binned = np.bincount(idx, weights=weights, minlength=len(self._counts))
        c = self._counts
        for i, v in enumerate(binned.tolist()):
            if v:
                c[i] += int(round(v))

    def add_many(self, vals: np.ndarray) -> None:
        """Observe every value of a float array."""
        if len(vals) == 0:
            return
        self._bin(vals)
        self._sum += float(vals.sum())
        self._count += len(vals)

    def _flush(self) -> None:
        if self._pending:
            pend = self._pending
            self._pending = []
            self._bin(np.asarray(pend, dtype=np.float64))
            self._sum += math.fsum(pend)
            self._count += len(pend)
        if self._pend_w:
            arr = np.asarray(self._pend_w, dtype=np.float64)
            self._pend_w = []
            self._bin(arr[:, 0], arr[:, 1])
            self._sum += float((arr[:, 0] * arr[:, 1]).sum())
            self._count += int(arr[:, 1].sum())
        if self._pend_lin:
            arr = np.asarray(self._pend_lin, dtype=np.float64)
            self._pend_lin = []
            first, step, k, w = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
            # observations <= bound b per run: clip(floor((b - first)/step + 1e-9) + 1, 0, k)
            q = (self._np_bounds[None, :] - first[:, None]) / step[:, None]
            le = np.clip(np.floor(q + 1e-9) + 1.0, 0.0, k[:, None])
            le[q < 0] = 0.0
            cum = (le * w[:, None]).sum(axis=0)
            total = float((k * w).sum())
            per_bucket = np.diff(np.concatenate(([0.0], cum, [total])))
            c = self._counts
            for i, v in enumerate(per_bucket.tolist()):
                if v:
                    c[i] += int(round(v))
            self._sum += float((w * (k * first + step * k * (k - 1) / 2.0)).sum())
            self._count += int(round(total))

    @property
    def counts(self) -> list[int]:
        self._flush()
        return self._counts

    @property
    def sum(self) -> float:
        self._flush()
        return self._sum

    @property
    def count(self) -> int:
        self._flush()
        return self._count

    def cumulative(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out


@dataclass
class PoolParams:
    """Engine and fleet parameters of one pool (all replicas of a pool are identical)."""

    name: str = "chat-8b"
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    replicas: int = 4
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 16384
    block_size: int = 16
    num_gpu_blocks: int = 18432  # 294,912 tokens: ~36 GiB of KV at 128 KiB/token (8B, bf16)
    enable_prefix_caching: bool = True
    prefix_cache_entries: int = 64  # distinct shared prefixes a replica keeps warm
    step_base_ms: float = 6.0
    step_per_seq_ms: float = 0.06
    step_per_1k_kv_ms: float = 0.06
    prefill_per_1k_ms: float = 45.0
    gpus_per_replica: int = 1
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    idle_watts: float = 100.0
    max_watts: float = 700.0
    gpu_memory_utilization: float = 0.9
    max_num_queued_reqs: int = 0  # vLLM's --max-num-queued-reqs: arrivals past it are rejected (0: no limit)

    @property
    def kv_capacity_tokens(self) -> int:
        """Usable KV tokens per replica (the null block excluded)."""
        return (self.num_gpu_blocks - 1) * self.block_size

    def validate(self) -> "PoolParams":
        def need(cond, what):
            if not cond:
                raise ValueError(f"pool {self.name!r}: {what}")
        need(isinstance(self.name, str) and self.name, "name must be a non-empty string")
        for f in ("replicas", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                  "block_size", "num_gpu_blocks", "gpus_per_replica", "prefix_cache_entries",
                  "max_num_queued_reqs"):
            v = getattr(self, f)
            need(isinstance(v, int) and not isinstance(v, bool), f"{f} must be an integer, got {v!r}")
        need(self.replicas >= 1, f"replicas must be >= 1, got {self.replicas}")
        need(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        need(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        need(self.max_num_queued_reqs >= 0, f"max_num_queued_reqs must be >= 0, got {self.max_num_queued_reqs}")
        need(self.num_gpu_blocks >= 2, f"num_gpu_blocks must be >= 2, got {self.num_gpu_blocks}")
        need(self.max_num_batched_tokens >= self.max_num_seqs,
             f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
             f"({self.max_num_seqs})")
        need(self.max_model_len <= self.kv_capacity_tokens,
             f"max_model_len ({self.max_model_len}) exceeds the KV capacity "
             f"({self.kv_capacity_tokens} tokens = (num_gpu_blocks-1) x block_size)")
        for f in ("step_base_ms", "step_per_seq_ms", "step_per_1k_kv_ms", "prefill_per_1k_ms",
                  "idle_watts", "max_watts"):
            v = getattr(self, f)
            need(isinstance(v, (int, float)) and v >= 0, f"{f} must be a number >= 0, got {v!r}")
        need(self.step_base_ms > 0, "step_base_ms must be > 0")
        need(self.max_watts >= self.idle_watts, "max_watts must be >= idle_watts")
        return self

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> "PoolParams":
        if not isinstance(data, dict):
            raise ValueError(f"pool {name!r}: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"pool {name!r}: unknown parameter(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        kwargs = dict(data)
        kwargs["name"] = name
        for f in fields(cls):
            if f.name in kwargs and f.type in ("float",) and isinstance(kwargs[f.name], int) \
                    and not isinstance(kwargs[f.name], bool):
                kwargs[f.name] = float(kwargs[f.name])
        return cls(**kwargs).validate()


# request states
WAITING, PREFILL, DECODE, DONE, ABORTED = range(5)


class Request:
    """One model call as the engine sees it."""

    __slots__ = ("rid", "arrival", "prompt", "output", "prefix_key", "prefix_tokens", "tag",
                 "state", "generated", "target", "todo", "blocks", "g_join", "gen_join",
                 "finish_g", "seq", "first_scheduled", "first_token", "finished", "preemptions",
                 "cached", "computed_prefill", "max_tokens", "finished_reason", "first_cached")

    def __init__(self, rid: int, arrival: float, prompt: int, output: int,
                 prefix_key: Optional[str] = None, prefix_tokens: int = 0, tag: Any = None,
                 max_tokens: Optional[int] = None):
        if prompt < 1 or output < 1:
            raise ValueError(f"request {rid}: prompt and output tokens must be >= 1 "
                             f"(got {prompt}, {output})")
        self.rid = rid
        self.arrival = arrival
        self.prompt = int(prompt)
        self.output = int(output)
        self.prefix_key = prefix_key
        self.prefix_tokens = int(prefix_tokens)
        self.tag = tag
        self.state = WAITING
        self.generated = 0
        self.target = 0
        self.todo = 0
        self.blocks = 0
        self.g_join = 0
        self.gen_join = 0
        self.finish_g = 0
        self.seq = 0
        self.first_scheduled: Optional[float] = None
        self.first_token: Optional[float] = None
        self.finished: Optional[float] = None
        self.preemptions = 0
        self.cached = 0
        self.computed_prefill = 0
        self.max_tokens = max_tokens if max_tokens is not None else output
        self.finished_reason = "length"
        self.first_cached = 0

    def natural_reason(self) -> str:
        return "length" if self.output >= self.max_tokens else "stop"


class _Op:
    """What the replica is doing until ``t_end``: one step (with prefill chunks) or a jump."""

    __slots__ = ("kind", "t0", "t_end", "k", "n", "a", "kv0", "c", "chunks", "prefill_tokens")

    def __init__(self, kind: str, t0: float, t_end: float, k: int = 1, n: int = 0,
                 a: float = 0.0, kv0: float = 0.0, c: float = 0.0, chunks: tuple = (),
                 prefill_tokens: int = 0):
        self.kind = kind  # "step", "jump" or "idle-wake"
        self.t0 = t0
        self.t_end = t_end
        self.k = k
        self.n = n  # decoding requests during the op
        self.a = a  # seconds per step independent of KV (jump)
        self.kv0 = kv0  # KV tokens at the first step (jump)
        self.c = c  # seconds per KV token (jump)
        self.chunks = chunks  # (req, tokens) prefill chunks of a step
        self.prefill_tokens = prefill_tokens


# column order of ReplicaStats.rows -> histogram fed by that column
ROW_HISTOGRAMS = (
    "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
    "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens",
    "request_generation_tokens", "request_params_max_tokens", "request_num_preemptions",
    "request_prefill_kv_computed_tokens", "request_time_per_output_token_seconds",
)


class ReplicaStats:
    """Counters and histograms in vLLM's terms (names follow the exposed families)."""

    def __init__(self, p: PoolParams, created: float):
        tok = request_token_buckets(p.max_model_len)
        self.created = created
        self.prompt_tokens = 0
        self.prompt_local_compute = 0
        self.prompt_cache_hit = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
        self.admission_rejections = 0  # arrivals turned away by max_num_queued_reqs
        self.rows: list[tuple] = []  # finished requests not yet binned (see ROW_HISTOGRAMS)
        self._h = {
            "request_prompt_tokens": Histo(tok),
            "request_generation_tokens": Histo(tok),
            "iteration_tokens_total": Histo(ITERATION_TOKENS_BUCKETS),
            "request_max_num_generation_tokens": Histo(tok),
            "request_params_n": Histo(PARAMS_N_BUCKETS),
            "request_params_max_tokens": Histo(tok),
            "time_to_first_token_seconds": Histo(TTFT_BUCKETS),
            "inter_token_latency_seconds": Histo(ITL_BUCKETS),
            "request_time_per_output_token_seconds": Histo(ITL_BUCKETS),
            "e2e_request_latency_seconds": Histo(REQUEST_LATENCY_BUCKETS),
            "request_queue_time_seconds": Histo(REQUEST_LATENCY_BUCKETS),
            "request_inference_time_seconds": Histo(REQUEST_LATENCY_BUCKETS),
            "request_prefill_time_seconds": Histo(REQUEST_LATENCY_BUCKETS),
            "request_decode_time_seconds": Histo(REQUEST_LATENCY_BUCKETS),
            "request_num_preemptions": Histo(NUM_PREEMPTIONS_BUCKETS),
            "request_prefill_kv_computed_tokens": Histo(tok),
        }
        self._http_duration_highr = Histo((0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0,
                                           1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0,
                                           30.0, 60.0))
        self._http_duration = Histo((0.1, 0.5, 1.0))
        self.http_requests = 0
        self.http_request_bytes = 0
        self.http_response_bytes = 0

    def flush(self) -> None:
        """Bin the finished-request rows into the per-request histograms (vectorised)."""
        rows = self.rows
        if not rows:
            return
        self.rows = []
        cols = np.asarray(rows, dtype=np.float64).T
        for i, key in enumerate(ROW_HISTOGRAMS):
            if key is not None:
                self._h[key].add_many(cols[i])
        self._h["request_max_num_generation_tokens"].add_many(cols[6])
        self._h["request_params_n"].observe(1.0, len(rows))
        self._http_duration_highr.add_many(cols[0])
        self._http_duration.add_many(cols[0])

    @property
    def h(self) -> dict[str, "Histo"]:
        self.flush()
        return self._h

    @property
    def http_duration_highr(self) -> "Histo":
        self.flush()
        return self._http_duration_highr

    @property
    def http_duration(self) -> "Histo":
        self.flush()
        return self._http_duration


class Replica:
    """A simulated vLLM replica (one engine)."""

    # longest run of decode steps taken as one event; 1 = step by step (the reference the jump
    # logic is tested and benchmarked against)
    max_jump: int = 1 << 30

    def __init__(self, params: PoolParams, index: int, start_time: float = 0.0):
        self.p = params
        self.pool = params.name
        self.index = index
        self.name = f"{params.name}-{index}"
        self.alive = True
        self.bs = params.block_size
        self.usable_blocks = params.num_gpu_blocks - 1
        self.waiting: deque[Request] = deque()
        self.running: "OrderedDict[int, Request]" = OrderedDict()  # admission order
        self.prefilling: "OrderedDict[int, Request]" = OrderedDict()
        self.n_decode = 0
        self.g = 0  # decode step counter
        self.cnt = [0] * self.bs  # decoding requests needing a block when g % bs == r
        self.s_tokens = 0  # sum(base - g_join) over decoding requests; tokens = s + n*g
        self.prefill_tokens_held = 0  # KV tokens computed so far by requests still in prefill
        self.used_blocks = 0
        self.heap: list[tuple[int, int, Request]] = []
        self.seq = 0
        self.op: Optional[_Op] = None
        self.lru: "OrderedDict[str, None]" = OrderedDict()
        self.stats = ReplicaStats(params, start_time)
        self.energy_j = 0.0
        self.t_energy = start_time
        self.busy_seconds = 0.0
        self.started = start_time
        self.version = 0  # bumps when the boundary time changes (stale heap entries)
        sp = params
        self._a0 = sp.step_base_ms / 1000.0
        self._b = sp.step_per_seq_ms / 1000.0
        self._c = sp.step_per_1k_kv_ms / 1e6  # seconds per KV token
        self._p = sp.prefill_per_1k_ms / 1e6  # seconds per prefill token

    # ------------------------------------------------------------------ state views
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return self.used_blocks / self.usable_blocks

    def kv_tokens_live(self) -> int:
        """Tokens held in KV by running requests (exact, request by request)."""
        total = 0
        for r in self.running.values():
            total += self.tokens_held(r)
        return total

    def tokens_held(self, r: Request) -> int:
        if r.state == DECODE:
            return r.target + (self.g - r.g_join)
        if r.state == PREFILL:
            return r.cached + r.computed_prefill
        return 0

    def power_watts(self, n: Optional[int] = None) -> float:
        p = self.p
        if n is None:
            n = self.n_decode + len(self.prefilling) if self.op is not None else 0
        if n <= 0 and self.op is None:
            return p.idle_watts
        frac = min(1.0, n / max(1, min(p.max_num_seqs, 128)))
        return p.idle_watts + (p.max_watts - p.idle_watts) * (0.45 + 0.55 * frac)

    def energy_at(self, t: float) -> float:
        """Joules consumed up to time t (per GPU)."""
        extra = max(0.0, t - self.t_energy)
        if self.op is not None and t > self.t_energy:
            # op in progress: busy power since its start, idle power before
            start = max(self.t_energy, self.op.t0)
            busy = max(0.0, min(t, self.op.t_end) - start)
            idle = max(0.0, extra - busy)
            return self.energy_j + busy * self.power_watts(self.op.n + len(self.op.chunks)) \
                + idle * self.p.idle_watts
        return self.energy_j + extra * self.p.idle_watts

    def steps_done_at(self, t: float) -> int:
        """Decode steps of the current op completed by time t (for mid-jump views)."""
        op = self.op
        if op is None or op.kind != "jump" or t <= op.t0:
            return 0
        if t >= op.t_end:
            return op.k
        return self._steps_within(op, t - op.t0)

    # ------------------------------------------------------------------ helpers
    def _jump_time(self, op: _Op, s: int) -> float:
        return s * (op.a + op.c * op.kv0) + op.c * op.n * s * (s - 1) / 2.0

    def _steps_within(self, op: _Op, dt: float) -> int:
        lo, hi = 0, op.k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._jump_time(op, mid) <= dt + 1e-12:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _crossings(self, k: int) -> int:
        """Blocks the decoding requests need over the next k steps."""
        if k <= 0 or self.n_decode == 0:
            return 0
        full, rest = divmod(k, self.bs)
        total = full * self.n_decode
        g = self.g
        cnt = self.cnt
        bs = self.bs
        for s in range(rest):
            total += cnt[(g + s) % bs]
        return total

    def _max_steps_for_blocks(self, free: int, limit: int) -> int:
        n = self.n_decode
        if n == 0:
            return limit
        full = free // n
        if full * self.bs >= limit:
            return limit
        k = full * self.bs
        free -= full * n
        g, bs, cnt = self.g, self.bs, self.cnt
        while k < limit:
            need = cnt[(g + k) % bs]
            if need > free:
                break
            free -= need
            k += 1
        return k

    def _kv_tokens_decode(self) -> int:
        return self.s_tokens + self.n_decode * self.g

    def _add_energy(self, t_from: float, t_to: float, n: int) -> None:
        if t_from > self.t_energy:
            self.energy_j += (t_from - self.t_energy) * self.p.idle_watts
            self.t_energy = t_from
        d = max(0.0, t_to - max(t_from, self.t_energy))
        self.energy_j += d * self.power_watts(n)
        self.busy_seconds += d
        self.t_energy = max(self.t_energy, t_to)

    # ------------------------------------------------------------------ membership
    def _join_decode(self, r: Request, t: float, completed: list) -> None:
        remaining = r.output - r.generated
        r.blocks = -(-r.target // self.bs)
        if remaining <= 0:
            r.state = PREFILL  # never decoded: leaves with its prefill blocks
            self._finish(r, t, completed, r.natural_reason())
            return
        r.state = DECODE
        r.g_join = self.g
        r.gen_join = r.generated
        r.finish_g = self.g + remaining
        self.n_decode += 1
        self.s_tokens += r.target - r.g_join
        self.cnt[(r.g_join - r.target) % self.bs] += 1
        self.seq += 1
        heapq.heappush(self.heap, (r.finish_g, self.seq, r))

    def _leave_decode(self, r: Request) -> None:
        r.generated = r.gen_join + (self.g - r.g_join)
        r.blocks = -(-(r.target + (self.g - r.g_join)) // self.bs)
        self.n_decode -= 1
        self.s_tokens -= r.target - r.g_join
        self.cnt[(r.g_join - r.target) % self.bs] -= 1

    def _free(self, r: Request) -> None:
        self.used_blocks -= r.blocks
        r.blocks = 0
        self.running.pop(r.rid, None)

    def _finish(self, r: Request, t: float, completed: list, reason: str = "length") -> None:
        if r.state == DECODE:
            self._leave_decode(r)
        elif r.state == PREFILL and r.rid in self.prefilling:
            self.prefilling.pop(r.rid, None)
            self.prefill_tokens_held -= r.cached + r.computed_prefill
        self._free(r)
        r.state = DONE
        r.finished = t
        r.finished_reason = reason
        st = self.stats
        st.success[reason] += 1
        first = r.first_token if r.first_token is not None else t
        sched = r.first_scheduled if r.first_scheduled is not None else t
        gen = r.generated
        st.rows.append((t - r.arrival, sched - r.arrival, first - sched, t - first, t - sched,
                        r.prompt, gen, r.max_tokens, r.preemptions,
                        max(0, r.prompt - r.first_cached),
                        (t - first) / (gen - 1) if gen > 1 else 0.0))
        if len(st.rows) >= 8192:
            st.flush()
        st.http_requests += 1
        st.http_request_bytes += 200 + 4 * r.prompt
        st.http_response_bytes += 300 + 4 * gen
        completed.append(r)

    def _preempt(self, r: Request) -> None:
        if r.state == DECODE:
            self._leave_decode(r)
        else:
            self.prefilling.pop(r.rid, None)
            self.prefill_tokens_held -= r.cached + r.computed_prefill
        self._free(r)
        r.state = WAITING
        r.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(r)

    def _preempt_newest(self) -> bool:
        if not self.running:
            return False
        rid = next(reversed(self.running))
        self._preempt(self.running[rid])
        return True

    def _can_admit(self, r: Request, free: int) -> bool:
        if len(self.running) >= self.p.max_num_seqs:
            return False
        need = -(-(r.prompt + r.generated) // self.bs)
        return need <= free

    # ------------------------------------------------------------------ driving
    def slow_down(self, factor: float) -> None:
        """Every step and prefill of this replica takes `factor` times as long from its next op on
        (a throttled GPU, a bad node, a noisy neighbour): its counts look normal, its tokens come
        slower."""
        if not factor > 0:
            raise ValueError(f"slow-down factor must be > 0, got {factor!r}")
        self._a0, self._b, self._c, self._p = (v * factor for v in (self._a0, self._b, self._c, self._p))

    def admits(self) -> bool:
        """Whether an arrival gets into the queue (`max_num_queued_reqs`); a refused one is counted
        as vLLM counts it (vllm:admission_rejections_total{reason="max_num_queued_reqs"})."""
        limit = self.p.max_num_queued_reqs
        if limit and len(self.waiting) >= limit:
            self.stats.admission_rejections += 1
            return False
        return True

    def enqueue(self, r: Request, t: float) -> Optional[float]:
        """Add a request at time t. Returns the new boundary time if it moved, else None."""
        if not self.alive:
            raise RuntimeError(f"replica {self.name} is down")
        if r.prompt + r.output > self.p.max_model_len:
            raise ValueError(f"request {r.rid}: prompt+output {r.prompt + r.output} exceeds "
                             f"max_model_len {self.p.max_model_len} of pool {self.pool}")
        r.state = WAITING
        self.waiting.append(r)
        op = self.op
        if op is None:
            self.op = _Op("idle-wake", t, t)
            self.version += 1
            return t
        if op.kind == "jump" and len(self.waiting) == 1 and t < op.t_end:
            done = self._steps_within(op, t - op.t0)
            new_k = min(op.k, done + 1)
            free = self.usable_blocks - self.used_blocks - self._crossings(new_k)
            if new_k < op.k and self._can_admit(r, free):
                op.k = new_k
                op.t_end = op.t0 + self._jump_time(op, new_k)
                self.version += 1
                return op.t_end
        return None

    def boundary(self, t: float) -> tuple[Optional[float], list[Request]]:
        """Finish the current op at time t and plan the next one.

        Returns (next boundary time or None when idle, requests completed at t)."""
        completed: list[Request] = []
        self._commit(t, completed)
        self._plan(t, completed)
        self.version += 1
        return (self.op.t_end if self.op is not None else None), completed

    def _commit(self, t: float, completed: list) -> None:
        op = self.op
        self.op = None
        if op is None or op.kind == "idle-wake":
            return
        st = self.stats
        if op.kind == "jump":
            k = op.k
            n = op.n
            self.used_blocks += self._crossings(k)
            self.g += k
            st.generation_tokens += n * k
            # each step emits one token per decoding request; step s lasts a + c*(kv0 + n*s)
            first = op.a + op.c * op.kv0
            st._h["inter_token_latency_seconds"].observe_linear(first, op.c * n, k, n)
            st._h["iteration_tokens_total"].observe(n, k)
            self._add_energy(op.t0, op.t_end, n)
        else:  # single step with prefill chunks (and maybe decode)
            n = op.n
            self.used_blocks += self._crossings(1)
            self.g += 1
            st.generation_tokens += n
            if n:
                st._h["inter_token_latency_seconds"].observe(op.t_end - op.t0, n)
            st._h["iteration_tokens_total"].observe(n + op.prefill_tokens)
            self._add_energy(op.t0, op.t_end, n + len(op.chunks))
            for r, chunk in op.chunks:
                if r.state != PREFILL:
                    continue
                r.computed_prefill += chunk
                r.todo -= chunk
                self.prefill_tokens_held += chunk
                if r.todo <= 0:
                    self.prefilling.pop(r.rid, None)
                    self.prefill_tokens_held -= r.cached + r.computed_prefill
                    if r.first_token is None:
                        r.first_token = t
                        st._h["time_to_first_token_seconds"].observe(t - r.arrival)
                        st.prompt_tokens += r.prompt
                        r.first_cached = min(r.cached, r.prompt)
                        st.prompt_local_compute += r.prompt - r.cached
                        st.prompt_cache_hit += r.cached
                    r.generated += 1
                    st.generation_tokens += 1
                    self._join_decode(r, t, completed)
        # completions: decoding requests whose last token came out at this boundary
        heap = self.heap
        while heap and heap[0][0] <= self.g:
            fg, _, r = heapq.heappop(heap)
            if r.state != DECODE or r.finish_g != fg:
                continue
            self._finish(r, t, completed, r.natural_reason())

    def _plan(self, t: float, completed: list) -> None:
        p = self.p
        bs = self.bs
        # 1. decode tokens of this step need blocks; preempt the newest until they fit
        preempted = False
        cnt = self.cnt
        while self.n_decode and cnt[self.g % bs] > self.usable_blocks - self.used_blocks:
            self._preempt_newest()
            preempted = True
        # 2. prefill work: continue partial prefills, then admit FCFS
        budget = p.max_num_batched_tokens - self.n_decode
        chunks: list[tuple[Request, int]] = []
        if budget > 0:
            for r in self.prefilling.values():
                if budget <= 0:
                    break
                c = min(r.todo, budget)
                chunks.append((r, c))
                budget -= c
        free = self.usable_blocks - self.used_blocks - (cnt[self.g % bs] if self.n_decode else 0)
        while (not preempted and budget > 0 and self.waiting
               and self._can_admit(self.waiting[0], free)):
            r = self.waiting.popleft()
            target = r.prompt + r.generated
            r.target = target
            need = -(-target // bs)
            r.blocks = need
            self.used_blocks += need
            free -= need
            cached = 0
            if p.enable_prefix_caching and r.prefix_key is not None and r.prefix_tokens > 0:
                self.stats.prefix_queries += target
                if r.prefix_key in self.lru:
                    cached = (min(r.prefix_tokens, target - 1) // bs) * bs
                    self.lru.move_to_end(r.prefix_key)
                    self.stats.prefix_hits += cached
                else:
                    self.lru[r.prefix_key] = None
                    if len(self.lru) > p.prefix_cache_entries:
                        self.lru.popitem(last=False)
            elif p.enable_prefix_caching:
                self.stats.prefix_queries += target
            r.cached = cached
            r.computed_prefill = 0
            r.todo = target - cached
            r.state = PREFILL
            if r.first_scheduled is None:
                r.first_scheduled = t
            self.running[r.rid] = r
            self.prefilling[r.rid] = r
            self.prefill_tokens_held += cached
            c = min(r.todo, budget)
            chunks.append((r, c))
            budget -= c
        n = self.n_decode
        kv = self._kv_tokens_decode() + self.prefill_tokens_held
        if chunks:
            ptoks = sum(c for _, c in chunks)
            d = self._a0 + self._b * (n + len(chunks)) + self._c * kv + self._p * ptoks
            self.op = _Op("step", t, t + d, 1, n, chunks=chunks, prefill_tokens=ptoks)
            return
        if n == 0:
            self.op = None  # idle
            return
        # 3. pure decode: jump to the next completion, or until the KV cache is full
        heap = self.heap
        while heap and (heap[0][2].state != DECODE or heap[0][2].finish_g != heap[0][0]):
            heapq.heappop(heap)
        k_done = heap[0][0] - self.g
        k = self._max_steps_for_blocks(self.usable_blocks - self.used_blocks,
                                       min(k_done, self.max_jump))
        k = max(1, k)  # step 1 fits (ensured above)
        op = _Op("jump", t, t, k, n, a=self._a0 + self._b * n, kv0=float(kv), c=self._c)
        op.t_end = t + self._jump_time(op, k)
        self.op = op

    def abandon(self, r: Request) -> bool:
        """The client of a request still waiting for its first schedule gives up: it leaves the
        queue (vLLM aborts a request whose client disconnected). False if it was scheduled."""
        if r.state != WAITING or r.first_scheduled is not None:
            return False
        try:
            self.waiting.remove(r)
        except ValueError:
            return False
        r.state = ABORTED  # a planned op stays valid: the running set did not change
        self.stats.success["abort"] += 1  # vLLM counts a request its client gave up on as finished_reason abort
        return True

    def kill(self, t: float) -> list[Request]:
        """The replica goes away: returns the in-flight requests (they are lost)."""
        self.alive = False
        lost = list(self.waiting) + list(self.running.values())
        for r in lost:
            r.state = ABORTED
        self.waiting.clear()
        self.running.clear()
        self.prefilling.clear()
        self.heap.clear()
        self.op = None
        self.n_decode = 0
        self.used_blocks = 0
        self.version += 1
        return lost

    # ------------------------------------------------------------------ consistency view
    def check_invariants(self) -> None:
        """Raise AssertionError when the engine state is inconsistent (used by tests)."""
        assert len(self.running) <= self.p.max_num_seqs, "running exceeds max_num_seqs"
        assert 0 <= self.used_blocks <= self.usable_blocks, "block pool out of range"
        held = 0
        for r in self.running.values():
            held += r.blocks if r.state == PREFILL else 0
        decode_blocks = 0
        for r in self.running.values():
            if r.state == DECODE:
                decode_blocks += -(-(r.target + (self.g - r.g_join)) // self.bs)
        assert held + decode_blocks == self.used_blocks, \
            f"used blocks {self.used_blocks} != per-request blocks {held + decode_blocks}"
        assert self.n_decode + len(self.prefilling) == len(self.running)
