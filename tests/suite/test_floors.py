"""The floors, held by a test: every module on one floor, imports only downwards, no circle.

The floors are declared once, in pyproject.toml (`[tool.importlinter]`): kit (settings, ticker,
timebox, process) < pool keys (poolkey) < data model (model, catalogue, shard, schema) < pure core (derive < capacity,
forecast < step) < edges (sources, export < history) < features (pipeline | digest) < app (config <
app < commands). import-linter checks the layers; the circle check below covers what a layers
contract does not: two modules of one floor that import each other. Both read every import
statement, deferred ones (inside a function) and TYPE_CHECKING ones included.
"""
from __future__ import annotations

import logging
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_floors_contract_is_kept(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    # import-linter configures logging as a command would (existing loggers disabled): put them back,
    # so the tests after this one still see headroom's log lines
    loggers = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    disabled = [lg.disabled for lg in loggers]
    try:
        code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        for lg, was in zip(loggers, disabled):
            lg.disabled = was
    out = capsys.readouterr().out
    assert code == 0, out[out.find("Broken contracts"):] or out


def _circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def enter(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)

    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        enter(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    enter(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_circle():
    graph = grimp.build_graph("monitor", include_external_packages=False, cache_dir=None)
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle():
    """The check itself can fail: a made-up graph with a -> b -> c -> a and a lone d."""
    g = grimp.ImportGraph()
    for m in ("p.a", "p.b", "p.c", "p.d"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    g.add_import(importer="p.c", imported="p.a")
    g.add_import(importer="p.d", imported="p.a")
    assert _circles(g) == [["p.a", "p.b", "p.c"]]

