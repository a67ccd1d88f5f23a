"""`headroom` command line.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`.
Flags follow Prometheus style (`--config.file`); each long flag is also settable as HEADROOM_* in the
environment (`--config.file` -> HEADROOM_CONFIG_FILE). A flag given on the command line wins.
"""
from __future__ import annotations

import os

# Small model fits run fastest on one BLAS thread; a multi-threaded OpenBLAS on a busy 2-core host
# turned a 0.5 s SARIMAX fit into 25 s. Set before numpy is imported; the environment still wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("monitor.commands.run", "run the daemon: collect, derive, forecast and serve /metrics"),
    "once": ("monitor.commands.once", "run one collection cycle and print the snapshot as JSON"),
    "check-config": ("monitor.commands.check_config", "validate a configuration file"),
    "demo": ("monitor.commands.demo", "start a simulated fleet, headroom and (if installed) Prometheus"),
    "sim": ("monitor.sim.cli", "run the simulated vLLM fleet on its own"),
    "backtest": ("monitor.forecast.cli", "rolling-origin backtest of every forecast model on a CSV series"),
    "plan": ("monitor.capacity.plan_cli", "capacity plan from a task mix"),
    "digest": ("monitor.digest.cli", "build and deliver the weekly forecast digest"),
    "loadtest": ("monitor.loadtest.cli", "closed-loop agent-task load test against an OpenAI-compatible endpoint"),
    "compare": ("monitor.loadtest.compare_cli", "compare two load-test results side by side"),
}


def env_name(flag: str) -> str:
    return "HEADROOM_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def apply_env_defaults(parser: argparse.ArgumentParser, environ=os.environ) -> None:
    """Let HEADROOM_* variables provide defaults for every long option of the parser."""
    for action in parser._actions:  # argparse offers no public walk over actions
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest in ("help",):
            continue
        value = environ.get(env_name(longs[0]))
        if value is None:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            action.default = value.strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(action, argparse._AppendAction):
            action.default = [v for v in value.split(",") if v]
        else:
            try:
                action.default = action.type(value) if action.type else value
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue  # not valid for this subcommand's flag; argparse reports it if the flag is used
        action.required = False


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="headroom", description=__doc__.splitlines()[0])
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"], help="log level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # subcommand not built into this version
            raise
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        apply_env_defaults(p)
        p.set_defaults(_module=module)
        subparsers[name] = p
    apply_env_defaults(parser)
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "_module", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
