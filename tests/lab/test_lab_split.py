"""The daemon ships alone: headroom (monitor/) and headroom-lab (lab/: the simulator, the load tester,
the demo) are two distributions, and monitor imports nothing of lab.

Unit: no module under monitor/ names headroom_lab; the add-on commands come from the entry points;
without headroom-lab, `headroom demo` and `headroom digest --demo` stop with one line naming what to
install. Live: both wheels built and opened; the runtime wheel installed on its own runs
`headroom --help` and refuses `headroom demo` with that line.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from monitor.commands import cli
from monitor.kit import addons

REPO = Path(__file__).resolve().parents[2]
LAB_ONLY = ("sim/", "loadtest/", "commands/demo.py", "commands/sim.py", "commands/loadtest.py",
            "commands/compare.py", "digest/demo.py", "digest_demo.py")


def _lab_imports(path: Path) -> list[str]:
    """Lines of `path` that import headroom_lab or name it as a module to import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if node.value.startswith("headroom_lab") else []
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] == "headroom_lab"]
    return found


def test_monitor_imports_nothing_of_lab():
    offenders = {str(p.relative_to(REPO)): v for p in sorted((REPO / "monitor").rglob("*.py"))
                 if (v := _lab_imports(p))}
    assert offenders == {}
    assert not [p for p in (REPO / "monitor").rglob("*") if any(
        str(p.relative_to(REPO / "monitor")).startswith(x) for x in LAB_ONLY)]


def test_the_checker_sees_an_import_of_lab(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import headroom_lab.sim\nfrom headroom_lab import x\nM = 'headroom_lab.commands.demo'\n"
                   "import monitor\n")
    assert _lab_imports(bad) == ["line 1: headroom_lab.sim", "line 2: headroom_lab",
                                 "line 3: headroom_lab.commands.demo"]


def test_the_lab_commands_come_from_the_entry_points():
    found = addons.commands()
    assert {name: module for name, (module, _) in found.items()} == {
        "demo": "headroom_lab.commands.demo", "sim": "headroom_lab.commands.sim",
        "loadtest": "headroom_lab.commands.loadtest", "compare": "headroom_lab.commands.compare"}
    assert set(found) == set(addons.LAB_COMMANDS)
    assert set(cli.all_commands()) == set(cli.SUBCOMMANDS) | set(found)
    assert addons.digest_demo().__name__ == "headroom_lab.digest_demo"
    _, subparsers = cli.build_parser("sim", lazy=True)
    assert list(subparsers) == ["sim"]  # only the chosen command's module is imported


def test_the_entry_point_reader_reads_what_importlib_metadata_reads():
    from importlib.metadata import entry_points
    for group in (addons.COMMANDS_GROUP, addons.DIGEST_DEMO_GROUP, "console_scripts"):
        ours = {(ep.name, ep.value) for ep in addons._entry_points(group)}
        assert ours == {(ep.name, ep.value) for ep in entry_points(group=group)}, group
    assert ("headroom", "monitor.commands.cli:main") in {(ep.name, ep.value) for ep in addons._entry_points("console_scripts")}
    assert addons.EntryPoint("x", "headroom_lab.commands:DEMO").load()[0] == "headroom_lab.commands.demo"


class _EntryPoint:
    def __init__(self, name, value, group):
        self.name, self.value, self.group = name, value, group

    def load(self):
        if self.value == "broken":
            raise ImportError("no module named broken")
        return ("x.y", "help") if self.value == "pair" else 42


@pytest.fixture
def no_lab(monkeypatch):
    """The entry points as they are when headroom-lab is not installed."""
    monkeypatch.setattr(addons, "_entry_points", lambda group: [])
    addons.commands.cache_clear()
    yield
    addons.commands.cache_clear()


@pytest.mark.parametrize("argv", [["demo"], ["sim", "--duration", "5"], ["--log.level", "debug", "loadtest"],
                                  ["compare", "a.json", "b.json"]])
def test_without_lab_its_commands_say_what_to_install(no_lab, capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"`headroom {argv[-1] if argv[0] == '--log.level' else argv[0]}`" in err
    assert "headroom-lab" in err and "pip install ./lab" in err and "make demo" in err
    assert "demo" not in cli.all_commands()


def test_without_lab_digest_demo_says_what_to_install(no_lab, capsys, tmp_path):
    assert cli.main(["digest", "--demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headroom digest: --demo") and err.count("\n") == 1
    assert "headroom-lab" in err and "pip install ./lab" in err
    assert list(tmp_path.iterdir()) == []


def test_a_broken_entry_point_is_left_out_with_a_warning(monkeypatch, caplog):
    eps = [_EntryPoint("good", "pair", addons.COMMANDS_GROUP), _EntryPoint("bad", "broken", addons.COMMANDS_GROUP),
           _EntryPoint("odd", "number", addons.COMMANDS_GROUP)]
    monkeypatch.setattr(addons, "_entry_points", lambda group: eps)
    addons.commands.cache_clear()
    try:
        assert addons.commands() == {"good": ("x.y", "help")}
    finally:
        addons.commands.cache_clear()
    text = caplog.text
    assert "bad = broken" in text and "does not load" in text and "odd = number" in text


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    str(source), "-w", str(out)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = out.glob("*.whl")
    return wheel


def _entry_points_txt(zf: zipfile.ZipFile) -> str:
    (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return zf.read(name).decode()


@pytest.mark.live  # builds wheels and runs pip and python (tests/tiers.py)
def test_the_runtime_wheel_holds_the_daemon_and_lab_the_rest(tmp_path):
    with zipfile.ZipFile(_wheel(REPO, tmp_path / "runtime")) as zf:
        names = zf.namelist()
        runtime_eps = _entry_points_txt(zf)
    packaged = [n for n in names if not n.split("/")[0].endswith(".dist-info")]
    assert packaged and all(n.startswith("monitor/") for n in packaged), packaged[:5]
    assert [n for n in packaged if n[len("monitor/"):].startswith(LAB_ONLY)] == []
    assert {"monitor/commands/cli.py", "monitor/kit/addons.py", "monitor/commands/digest.py", "monitor/app/__init__.py"} <= set(names)
    assert "headroom.commands" not in runtime_eps and "headroom = monitor.commands.cli:main" in runtime_eps

    with zipfile.ZipFile(_wheel(REPO / "lab", tmp_path / "lab")) as zf:
        names = set(zf.namelist())
        lab_eps = _entry_points_txt(zf)
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in zf.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert {"headroom_lab/sim/engine.py", "headroom_lab/sim/default_fleet.yaml", "headroom_lab/sim/default_mix.yaml",
            "headroom_lab/sim/data/azure_llm_2023_code_slice.csv", "headroom_lab/loadtest/runner.py",
            "headroom_lab/commands/demo.py", "headroom_lab/commands/compare.py", "headroom_lab/digest_demo.py"} <= names
    assert not [n for n in names if n.startswith("monitor/")]
    assert "Requires-Dist: headroom" in requires
    for name in addons.LAB_COMMANDS:
        assert f"{name} = headroom_lab.commands:{name.upper()}" in lab_eps
    assert "[headroom.digest_demo]" in lab_eps and "demo = headroom_lab.digest_demo" in lab_eps

    # the runtime wheel on its own (no site-packages, so no headroom-lab): --help, then `demo` refused
    target = tmp_path / "alone"
    (runtime,) = (tmp_path / "runtime").glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(runtime)],
                   check=True, capture_output=True, text=True, timeout=300)
    code = f"import sys; sys.path.insert(0, {str(target)!r}); from monitor.commands.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def headroom(*argv):
        return subprocess.run([sys.executable, "-I", "-S", "-c", code, *argv], capture_output=True, text=True,
                              timeout=120, env=env, cwd=tmp_path)
    helped = headroom("--help")
    assert helped.returncode == 0 and "check-config" in helped.stdout and "loadtest" not in helped.stdout
    refused = headroom("demo")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("headroom: `headroom demo` comes with headroom-lab, which is not installed: "
                              "pip install ./lab (or make demo)\n")


@pytest.mark.live  # runs python in a subprocess (tests/tiers.py)
def test_help_imports_no_command_module():
    code = ("import sys; from monitor.commands.cli import build_parser; build_parser(None, lazy=True); "
            "print(sorted(m for m in sys.modules if m.startswith(('headroom_lab', 'monitor.commands', 'numpy'))"
            " and m not in ('monitor.commands', 'monitor.commands.cli')))")  # the command line itself
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "['headroom_lab', 'headroom_lab.commands']"
