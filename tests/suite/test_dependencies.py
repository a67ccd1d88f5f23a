"""The daemon's runtime dependencies (pyproject.toml `dependencies`) are what monitor/ imports: each
declared one is imported somewhere, and everything monitor/ imports is the standard library, monitor
itself or a declared one. (requests and APScheduler were declared long after the daemon stopped
needing them, issue 41; the tests' own packages are the `test` extra.)"""
from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMPORT_NAME = {"prometheus-client": "prometheus_client", "pyyaml": "yaml"}  # distribution -> module


def declared() -> set[str]:
    project = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", project, re.M | re.S).group(1)
    names = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, re.M)
    return {IMPORT_NAME.get(n.lower(), n.lower().replace("-", "_")) for n in names}


@functools.cache  # both tests read it: monitor/ parsed once
def imported() -> dict[str, set[str]]:
    """Top-level module -> the files of monitor/ that import it (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for path in (REPO / "monitor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return out


def test_every_declared_dependency_is_imported_by_the_daemon():
    deps, used = declared(), imported()
    assert {"prometheus_client", "numpy", "yaml"} <= deps  # the parse found the list
    assert not deps - set(used), f"declared in pyproject.toml but not imported by monitor/: {sorted(deps - set(used))}"


def test_the_daemon_imports_only_the_standard_library_and_its_dependencies():
    allowed = declared() | set(sys.stdlib_module_names) | {"monitor"}
    extra = {m: sorted(files)[:3] for m, files in imported().items() if m not in allowed}
    assert not extra, f"imported by monitor/ but not declared in pyproject.toml dependencies: {extra}"
