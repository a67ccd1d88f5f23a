"""Kinds whose values are sections: one nested section, lists and maps of them, tagged variants."""
from __future__ import annotations

from dataclasses import field
from typing import Any, Optional

from monitor.kit.settings.kinds import Kind
from monitor.kit.settings.reader import Reader, Spec
from monitor.kit.settings.values import type_name


def group(cls: type, *, path: str = "", help: str = "") -> Any:
    """Merge the keys of section `cls` into this section's mapping (at `path`, "" for the same level)."""
    return field(default_factory=cls, metadata={"spec": Spec(Sub(cls), help, path, merge=True)})


class Sub(Kind):
    """A nested section (a mapping, or the section's shorthand: its SHORTHAND names it)."""

    def __init__(self, cls: type):
        self.cls = cls

    @property
    def name(self) -> str:
        short = getattr(self.cls, "SHORTHAND", "")
        return f"mapping or {short}" if short else "mapping"

    def read(self, r: Reader, value: Any, key: str) -> Any:
        return r.section(self.cls, value, key)

    def show(self, value: Any) -> str:
        return ""

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return [(prefix, self.cls, "")]


class ListOf(Kind):
    def __init__(self, item: Kind, *, single: bool = False, as_tuple: bool = False):
        self.item, self.single, self.as_tuple = item, single, as_tuple  # single: one item may stand alone

    @property
    def name(self) -> str:
        return f"list of {self.item.name}"

    def read(self, r: Reader, value: Any, key: str) -> Any:
        if self.single and not isinstance(value, (list, dict)):
            value = [value]
        if not isinstance(value, list):
            raise r.fail(key, f"expected a list, got {type_name(value)}")
        out = [self.item.read(r, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if self.as_tuple else out

    def show(self, value: Any) -> str:
        return "[" + ", ".join(self.item.show(v) for v in value) + "]"

    def rules(self) -> str:
        return self.item.rules()

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return self.item.children(f"{prefix}[]")


class MapOf(Kind):
    """A mapping whose keys are the user's own names (pools, task types); `name_field` receives them."""

    def __init__(self, item: Kind, *, name_field: Optional[str] = None, names: str = "name"):
        self.item, self.name_field, self.names = item, name_field, names

    @property
    def name(self) -> str:
        return f"mapping of {self.names} to {self.item.name}"

    def read(self, r: Reader, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise r.fail(key, f"expected a mapping, got {type_name(value)}")
        out = {}
        for k, v in value.items():
            where = f"{key}.{k}"
            if self.name_field and isinstance(self.item, Sub):
                out[str(k)] = r.section(self.item.cls, v, where, extra={self.name_field: str(k)})
            else:
                out[str(k)] = self.item.read(r, v, where)
        return out

    def rules(self) -> str:
        return self.item.rules()

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return self.item.children(f"{prefix}.<{self.names}>")


class Tagged(Kind):
    """One of several sections, picked by the value of its `tag` key."""

    name = "mapping"

    def __init__(self, tag: str, variants: dict[str, type]):
        self.tag, self.variants = tag, variants

    def read(self, r: Reader, value: Any, key: str) -> Any:
        if not isinstance(value, dict):
            raise r.fail(key, f"expected a mapping, got {type_name(value)}")
        tag = value.get(self.tag)
        if not isinstance(tag, str) or tag not in self.variants:
            raise r.fail(f"{key}.{self.tag}", f"expected one of {', '.join(self.variants)}, got {tag!r}")
        return r.section(self.variants[tag], value, key)

    def children(self, prefix: str) -> list[tuple[str, type, str]]:
        return [(prefix, cls, f"{self.tag}: {tag}") for tag, cls in self.variants.items()]
