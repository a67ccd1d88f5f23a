"""Which pools one gateway's readings may feed: where the gateway sits in the fleet (pure).

With `global.pool_by: [cluster, model_name]` the same model in two clusters is two pools. A gateway
entry says where it sits with `labels` (sources.gateways[i].labels, e.g. {cluster: a}: the extra
pool_by labels it serves); its scope is the pools whose keys carry those labels (every pool when it
gives none). Inside its scope:

    a name (its `pool:`, a capacity.task_pools target, a `pools:` map value) -> the one pool key of
        that name (or that key itself)
    a model (a series' model label)                                          -> the one pool serving it

Two pools in scope answering (a gateway without labels in front of two clusters that serve the same
model) is ambiguous: the reading is not attributed to either, never to both (`Scope.named` and
`Scope.serving` say so; the callers count it as gateway_unattributed / gateway_queue_unmapped).
Without extra pool_by labels every key is a plain name and a scope is every pool: nothing changes.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping, Optional

from ..model.poolkey import extras_of, name_of


class Scope:
    """The pools (key, served model) a gateway with these `labels` may feed."""

    def __init__(self, pools: Iterable[tuple[str, str]], labels: Mapping[str, str] = MappingProxyType({})) -> None:
        want = dict(labels)
        self.pools: dict[str, str] = {}
        for key, model in pools:
            extras = extras_of(key)
            if all(extras.get(label) == value for label, value in want.items()):
                self.pools[key] = model
        self._by_model: dict[str, list[str]] = {}
        self._by_name: dict[str, list[str]] = {}
        for key, model in self.pools.items():
            self._by_model.setdefault(model, []).append(key)
            self._by_name.setdefault(name_of(key), []).append(key)

    def __len__(self) -> int:
        return len(self.pools)

    def only(self) -> Optional[str]:
        """The one pool in scope (it takes the gateway's whole reading), else None."""
        return next(iter(self.pools)) if len(self.pools) == 1 else None

    def named(self, name: Optional[str]) -> tuple[Optional[str], bool]:
        """(the pool key `name` stands for in scope, whether two or more pools answer to it)."""
        if name is None:
            return None, False
        if name in self.pools:
            return name, False
        keys = self._by_name.get(name, ())
        return (keys[0] if len(keys) == 1 else None), len(keys) > 1

    def serving(self, model: Optional[str]) -> tuple[Optional[str], bool]:
        """(the one pool in scope serving `model`, whether two or more do)."""
        keys = self._by_model.get(model, ()) if model is not None else ()
        return (keys[0] if len(keys) == 1 else None), len(keys) > 1

    def routes(self, task_pools: Mapping[str, str]) -> tuple[dict[str, Optional[str]], list[str]]:
        """capacity.task_pools resolved in scope: ({task type: pool key or None}, the task types
        whose target is ambiguous here). A target no pool in scope answers to is None: fed nowhere
        (a gateway never feeds a pool outside its scope)."""
        out: dict[str, Optional[str]] = {}
        ambiguous = []
        for task_type, target in task_pools.items():
            out[task_type], many = self.named(target)
            if many:
                ambiguous.append(task_type)
        return out, ambiguous


__all__ = ["Scope"]
