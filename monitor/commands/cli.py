"""`headroom` command line.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`.
Flags follow Prometheus style (`--config.file`); each long flag is also settable as HEADROOM_* in the
environment (`--config.file` -> HEADROOM_CONFIG_FILE). A flag given on the command line wins; a
variable is checked as its flag is (an invalid one stops the command with `headroom: HEADROOM_X: ...`).
"""
from __future__ import annotations

import os

# Small model fits run fastest on one BLAS thread; a multi-threaded OpenBLAS on a busy 2-core host
# turned a 0.5 s SARIMAX fit into 25 s. Set before numpy is imported; the environment still wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import importlib
import logging
import sys
from typing import Any

from monitor.kit.redact import redact_urls

# name -> (module, one-line help); installed add-ons add theirs (monitor/kit/addons.py, `all_commands`)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("monitor.commands.run", "run the daemon: collect, derive, forecast and serve /metrics"),
    "once": ("monitor.commands.once", "run one collection cycle and print the snapshot as JSON"),
    "check-config": ("monitor.commands.check_config", "validate a configuration file"),
    "backtest": ("monitor.commands.backtest", "rolling-origin backtest of every forecast model on a CSV series"),
    "plan": ("monitor.commands.plan", "capacity plan from a task mix"),
    "digest": ("monitor.commands.digest", "build and deliver the weekly forecast digest"),
}


def all_commands() -> dict[str, tuple[str, str]]:
    """The built-in subcommands, then those the installed add-ons register (a built-in name wins)."""
    from monitor.kit import addons  # noqa: PLC0415
    return {**SUBCOMMANDS, **{k: v for k, v in addons.commands().items() if k not in SUBCOMMANDS}}


def env_name(flag: str) -> str:
    return "HEADROOM_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def seconds(text: str) -> float:
    """argparse type of a run length: a positive duration (90, 90s, 5m)."""
    from monitor.kit.settings.values import parse_duration  # noqa: PLC0415
    try:
        number = float(text)
    except ValueError:
        number = None  # a duration like 90s
    try:
        value = parse_duration(text if number is None else number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def listen_address(text: str) -> str:
    """argparse type of --web.listen-address: HOST:PORT or :PORT, the port 0 to 65535 (the flag and
    its HEADROOM_ variable are refused naming themselves; bound as given)."""
    from monitor.export.server import parse_listen_address  # noqa: PLC0415
    try:
        parse_listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _env_value(action: argparse.Action, flag: str, text: str):
    """`text` read as the flag reads its argument: its type and its choices (ValueError: why not)."""
    value: Any = text
    if callable(action.type):  # (argparse also takes a registered name; this parser names none)
        try:
            value = action.type(text)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            what = getattr(action.type, "__name__", "")
            why = f"invalid {what} value {text!r}" if what in ("int", "float") else str(exc)
            raise ValueError(f"{why} (read as {flag})") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"expected one of {', '.join(map(str, action.choices))} (as {flag}), got {text!r}")
    return value


def apply_env_defaults(parser: argparse.ArgumentParser, environ=os.environ) -> list[str]:
    """Let HEADROOM_* variables provide defaults for every long option of the parser.

    Each value is checked as its flag checks an argument (type, choices; true/false for a switch).
    Returns the problems, one line each (`HEADROOM_X: problem`); a refused value sets nothing."""
    problems = []
    for action in parser._actions:  # argparse offers no public walk over actions
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest in ("help",):
            continue
        name = env_name(longs[0])
        text = environ.get(name)
        if text is None:
            continue
        value: Any
        try:
            if isinstance(action, argparse._StoreTrueAction):
                if text.strip().lower() not in _TRUE + _FALSE:
                    raise ValueError(f"expected true or false (1/0, yes/no, on/off) for {longs[0]}, got {text!r}")
                value = text.strip().lower() in _TRUE
            elif isinstance(action, argparse._AppendAction):
                value = [_env_value(action, longs[0], v) for v in text.split(",") if v]
            else:
                value = _env_value(action, longs[0], text)
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
        else:
            action.default = value
        action.required = False  # given, if wrongly: the command stops on the problem, not on a missing flag
    return problems


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (RFC 3339, UTC), level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        import json  # noqa: PLC0415
        from datetime import datetime, timezone  # noqa: PLC0415
        doc = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "msg": redact_urls(record.getMessage())}
        if record.exc_info:
            doc["exc"] = redact_urls(self.formatException(record.exc_info))
        return json.dumps(doc)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`; the user information of any URL in a line is masked (a URL given
    with user:password@ never reaches the log, whoever logged it: monitor/kit/redact.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_urls(super().format(record))


class StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted, not the stream it was at set-up
    (one replaced since, e.g. by a caller capturing output, may be closed)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging(level: str, fmt: str = "logfmt") -> None:
    """headroom's lines at `level` (the scheduler is headroom's own, monitor/kit/ticker.py: it logs an
    overrunning job once, in headroom's words)."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))


def chosen_command(argv: list[str], commands: dict | None = None) -> str | None:
    """The subcommand named on the command line (the first word that is one), or None."""
    commands = all_commands() if commands is None else commands
    return next((a for a in argv if a in commands), None)


def missing_add_on(argv: list[str], commands: dict) -> str | None:
    """The line saying what to install, when the command asked for comes with an add-on that is not
    installed (`headroom demo` without headroom-lab); None otherwise."""
    from monitor.kit import addons  # noqa: PLC0415
    word = next((a for a in argv if a in commands or a in addons.LAB_COMMANDS), None)
    if word is None or word in commands:
        return None
    return "headroom: " + addons.missing(f"`headroom {word}`")


def build_parser(only: str | None = None, lazy: bool = False
                 ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser of every subcommand; with `lazy`, only the module of `only` is imported (the
    others are listed with their help line), so `headroom --help` imports no subcommand at all and
    `headroom once ...` only what `once` needs."""
    parser = argparse.ArgumentParser(prog="headroom", description=__doc__.splitlines()[0])
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="log level (the scheduler's per-job lines show at debug only)")
    parser.add_argument("--log.format", dest="log_format", default="logfmt", choices=["logfmt", "json"],
                        help="log line format: logfmt (time level logger: message) or json (one object a line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in all_commands().items():
        if lazy and name != only:
            sub.add_parser(name, help=help_text, description=help_text, add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # subcommand not built into this version
            raise
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module, _env_problems=apply_env_defaults(p))
        subparsers[name] = p
    parser.set_defaults(_env_problems=[], _global_env_problems=apply_env_defaults(parser))
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = all_commands()
    absent = missing_add_on(argv, commands)
    if absent:
        print(absent, file=sys.stderr)
        return 2
    parser, _ = build_parser(chosen_command(argv, commands), lazy=True)
    args = parser.parse_args(argv)
    problems = args._global_env_problems + args._env_problems  # only the flags of this command count
    if problems:
        print(f"headroom: {problems[0]}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    if not getattr(args, "_module", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
