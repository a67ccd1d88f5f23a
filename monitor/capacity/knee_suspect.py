"""When a learned knee stops describing the engine: the engine changed under it.

A knee is learned from latency at load on the engine as it was. Two changes move it without the load
showing it: the KV capacity per replica (a restart with other settings, vLLM 0.34's extensible cache
sized again after warm-up) and speculative decoding's acceptance (vllm:spec_decode_num_accepted_tokens /
_num_draft_tokens: each decode step yields 1 + accepted / drafts tokens, so a drop in acceptance is
slower decoding at the same batch, and the knee comes earlier).

`KneeWatch` keeps, for one pool, the learned knee it last saw with the acceptance and KV capacity per
replica of that cycle. Each cycle `suspect(watch, knee, acceptance, kv_capacity)` compares:
    - a knee that is not learned (a prior follows the limits by itself), or a newly published one
      (its references are taken now): not suspect;
    - KV capacity per replica off its reference by more than 1 %: suspect;
    - acceptance off its reference by more than SUSPECT_CHANGE (20 %, relative), or present now and
      absent then (speculative decoding turned on): suspect. Unknown now (no drafts in the window)
      is no evidence either way.
The answer is why ("" when not suspect): headroom_knee_suspect and the JSON's knee_suspect. The knee
is not withdrawn: it is the best knee there is until the estimator learns the new one (which clears
the mark, being a new knee).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from monitor.capacity.knee import Knee

SUSPECT_CHANGE = 0.2  # relative change of acceptance that marks the knee
KV_CHANGE = 0.01  # relative change of KV capacity per replica that does


@dataclass
class KneeWatch:
    knee: Optional[float] = None  # the learned knee (requests) the references belong to
    acceptance: Optional[float] = None
    kv_capacity: Optional[float] = None


def _off(now: Optional[float], then: Optional[float], by: float) -> bool:
    return now is not None and then is not None and abs(now - then) > by * max(abs(then), 1e-12)


def suspect(watch: KneeWatch, knee: Knee, acceptance: Optional[float], kv_capacity: Optional[float]) -> str:
    """Why the learned knee no longer describes the engine, or "" (see the module docstring)."""
    if knee.source != "learned" or knee.requests is None:
        watch.knee = None
        return ""
    if watch.knee != knee.requests:
        watch.knee, watch.acceptance, watch.kv_capacity = knee.requests, acceptance, kv_capacity
        return ""
    why = []
    if _off(kv_capacity, watch.kv_capacity, KV_CHANGE):
        why.append(f"KV capacity per replica {watch.kv_capacity:.0f} -> {kv_capacity:.0f} tokens since it was learned")
    if _off(acceptance, watch.acceptance, SUSPECT_CHANGE):
        why.append(f"speculative acceptance {watch.acceptance:.2f} -> {acceptance:.2f} since it was learned")
    elif acceptance is not None and watch.acceptance is None:
        why.append(f"speculative decoding began (acceptance {acceptance:.2f}) after it was learned")
    return "; ".join(why)
