"""The pure core takes typed readings only: no module under monitor.capacity, monitor.derive or
monitor.step imports monitor.sources, neither directly (an import inside a function counts) nor
through another module. The readers inside monitor.sources import each other one way only (no
circle). What the core reads from a source is a type of monitor/readings.py (docs/architecture.md).

The import graph is grimp's (the static imports of every module, function bodies included).
"""
from __future__ import annotations

import grimp

CORE = ("capacity", "derive", "step")


def _graph(package: str):
    return grimp.build_graph(package, cache_dir=None)  # no cache written into the tree


def _in(module: str, root: str, part: str) -> bool:
    return module == f"{root}.{part}" or module.startswith(f"{root}.{part}.")


def core_chains_to_sources(graph, root: str) -> list[tuple[str, ...]]:
    """Every (core module, sources module) pair joined by an import chain: the shortest chain of each."""
    core = sorted(m for m in graph.modules if any(_in(m, root, part) for part in CORE))
    sources = sorted(m for m in graph.modules if _in(m, root, "sources"))
    chains = []
    for importer in core:
        for imported in sources:
            chain = graph.find_shortest_chain(importer=importer, imported=imported)
            if chain:
                chains.append(tuple(chain))
    return chains


def circles(graph, package: str) -> list[tuple[str, str]]:
    """Pairs of modules of `package` each of which imports the other (through any chain)."""
    mods = sorted(m for m in graph.modules if m.startswith(package + "."))
    return [(a, b) for i, a in enumerate(mods) for b in mods[i + 1:]
            if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)]


def test_the_pure_core_imports_nothing_from_sources():
    graph = _graph("monitor")
    core = [m for m in graph.modules if any(_in(m, "monitor", part) for part in CORE)]
    assert "monitor.capacity.enrich" in core and "monitor.derive.gateway_queues" in core and "monitor.step" in core
    assert core_chains_to_sources(graph, "monitor") == []
    # what the core reads from gateways, routers and DCGM is the model floor's
    assert graph.find_modules_directly_imported_by("monitor.readings") <= {"monitor.model"}


def test_no_import_circle_inside_sources():
    graph = _graph("monitor")
    assert len([m for m in graph.modules if m.startswith("monitor.sources.")]) > 10
    assert circles(graph, "monitor.sources") == []


def test_the_checks_find_an_import_in_a_function_one_through_another_module_and_a_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "fakemon"
    files = {
        "__init__.py": "",
        "model.py": "from fakemon.sources import wire\n",
        "step.py": "from fakemon import model\n",  # through the model floor
        "capacity/__init__.py": "",
        "capacity/tasks.py": "def read():\n    from fakemon.sources.parse import text\n    return text\n",
        "derive/__init__.py": "",
        "derive/core.py": "from fakemon import readings\n",
        "readings.py": "X = 1\n",
        "sources/__init__.py": "",
        "sources/wire.py": "X = 1\n",
        "sources/parse.py": "from fakemon.sources import rules\ntext = 1\n",
        "sources/rules.py": "def check():\n    from fakemon.sources import parse\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = _graph("fakemon")
    chains = core_chains_to_sources(graph, "fakemon")
    assert ("fakemon.capacity.tasks", "fakemon.sources.parse") in chains
    assert ("fakemon.step", "fakemon.model", "fakemon.sources.wire") in chains
    assert not [c for c in chains if c[0] == "fakemon.derive.core"]  # the readings floor is allowed
    assert circles(graph, "fakemon.sources") == [("fakemon.sources.parse", "fakemon.sources.rules")]
