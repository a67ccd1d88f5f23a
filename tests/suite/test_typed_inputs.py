"""Every floor below the configuration gets typed inputs, never the whole configuration (issue 41).

The floors are the layers of pyproject.toml `[tool.importlinter]`; the modules of every layer below
`config` (pipeline, digest, history, sources, export, step, capacity, forecast, derive, ...) may not take the
whole `Config`: no function parameter, and no class field (a dataclass's constructor parameter), is
annotated `Config`, and none is named `cfg` or `config` unless its type says which part of the
configuration it is (a `GatewayConfig` is one gateway's reading rules). Each such floor gets a typed
value the application builds from its Config in monitor/config/inputs.py (`CapacityInputs`,
`StepSettings`, `PipelineSettings`, ...) or named arguments. Only the app and the commands, above
`config`, hold the whole Config.
"""
from __future__ import annotations

import ast
import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
WHOLE = {"Config", "Any", ""}  # types that say nothing narrower than the whole configuration
NAMES = {"cfg", "config"}


def _layers() -> list[str]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in doc["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [layer.strip() for layer in contract["layers"]]


def below_config() -> list[pathlib.Path]:
    """The modules of the layers under `config` in the import contract."""
    layers = _layers()
    return _modules(layers[layers.index("config") + 1:])


def _modules(under: list[str]) -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for layer in under:
        for name in (n.strip() for n in layer.split("|")):
            package, module = ROOT / "monitor" / name, ROOT / "monitor" / f"{name}.py"
            files += sorted(package.rglob("*.py")) if package.is_dir() else [module]
    return files


def _type(annotation) -> str:
    """The outer name of an annotation (`Optional[Config]` -> Config, `"Config"` -> Config)."""
    if annotation is None:
        return ""
    text = annotation.value if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str) \
        else ast.unparse(annotation)
    for wrapper in ("Optional[", "typing.Optional["):
        if text.startswith(wrapper):
            text = text[len(wrapper):-1]
    return text.split("[")[0].split(".")[-1].strip("'\" ")


def _whole(name: str, annotation) -> bool:
    kind = _type(annotation)
    return kind == "Config" or (name in NAMES and kind in WHOLE)


def whole_config_parameters(source: str) -> list[str]:
    """`line: where name: type` of each parameter or class field that takes the whole configuration."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]:
                if _whole(arg.arg, arg.annotation):
                    out.append(f"{arg.lineno}: {getattr(node, 'name', 'lambda')} {arg.arg}: {_type(arg.annotation)}")
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and _whole(st.target.id,
                                                                                               st.annotation):
                    out.append(f"{st.lineno}: {node.name}.{st.target.id}: {_type(st.annotation)}")
    return out


def test_the_check_finds_a_whole_configuration():
    found = whole_config_parameters(
        "def a(cfg, n: int): ...\n"
        "def b(settings: 'Config'): ...\n"
        "def c(config: Any): ...\n"
        "def d(x: Optional[Config] = None): ...\n"
        "class S:\n    config: Config\n"
        "def ok(config: GatewayConfig, inputs: CapacityInputs, timeout: float): ...\n")
    assert found == ["1: a cfg: ", "2: b settings: Config", "3: c config: Any", "4: d x: Config", "6: S.config: Config"]


def test_no_floor_below_the_configuration_takes_the_whole_configuration():
    files = below_config()
    names = {p.relative_to(ROOT / "monitor").parts[0] for p in files}
    assert {"pipeline", "capacity", "sources", "history", "digest", "step", "kit"} <= names  # the layers were read
    assert ROOT / "monitor" / "pipeline" / "cycle.py" in files  # the cycle's floor too, with no allowance
    found = [f"monitor/{p.relative_to(ROOT / 'monitor')}:{where}" for p in files
             for where in whole_config_parameters(p.read_text())]
    assert found == [], "give these typed inputs (monitor/config/inputs.py), not the Config:\n" + "\n".join(found)
