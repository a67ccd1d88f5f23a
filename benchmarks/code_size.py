"""How many functions in monitor/ are over 80 lines and how many modules over 400 (the style guide's
limits), with the names: `python benchmarks/code_size.py [--json]`.

A function's length is from its `def` (decorators included) to its last line; a nested function is
counted on its own and inside its parent. A module's length is its line count.
"""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

MONITOR = Path(__file__).resolve().parents[1] / "monitor"
FUNCTION_LIMIT, MODULE_LIMIT = 80, 400


def long_functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - first + 1
            if length > FUNCTION_LIMIT:
                out.append((f"{path.relative_to(MONITOR.parent)}:{node.lineno} {node.name}", length))
    return out


def measure(root: Path = MONITOR) -> dict:
    functions, modules, total = [], [], 0
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        total += lines
        if lines > MODULE_LIMIT:
            modules.append((str(path.relative_to(root.parent)), lines))
        functions += long_functions(path)
    return {"lines": total, "functions_over_80": sorted(functions, key=lambda f: -f[1]),
            "modules_over_400": sorted(modules, key=lambda m: -m[1])}


def main(argv: list[str]) -> int:
    m = measure()
    if "--json" in argv:
        print(json.dumps(m, indent=1))
        return 0
    print(f"monitor/: {m['lines']} lines; {len(m['functions_over_80'])} functions over {FUNCTION_LIMIT} lines, "
          f"{len(m['modules_over_400'])} modules over {MODULE_LIMIT} lines")
    for name, n in m["functions_over_80"]:
        print(f"  function {name}: {n}")
    for name, n in m["modules_over_400"]:
        print(f"  module {name}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
