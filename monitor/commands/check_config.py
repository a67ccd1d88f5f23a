"""`headroom check-config FILE`: validate a configuration file (exit 0 when valid, 2 when not).

It runs what `headroom run` runs before it starts anything: `monitor.config.load` (the whole file,
every section) and, with `--web.config.file` or `web.config_file`, the web-config parser. A refused
file gives the same one line as `run`: `headroom: file: key: problem`.

The history store is checked as `run` opens it (`monitor.history.store.store_problem`): a store
`run` could not write (a read-only mount, a missing directory) exits 1 with one line naming
`store.path`; `run` would still start and serve live numbers, without writing history. A store
whose header or first page is damaged is valid (exit 0) with one line saying `run` moves it aside.
"""
from __future__ import annotations

import sys

from ..config import ConfigError, load


def add_arguments(p) -> None:
    p.add_argument("file", help="configuration file (YAML)")
    p.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="also validate this web-config file (TLS and basic auth of headroom's endpoints)")


def run(args) -> int:
    try:
        cfg = load(args.file)
        web_config = args.web_config_file or cfg.web_config_file
        if web_config:
            from monitor.kit.web.webconfig import web_security  # noqa: PLC0415
            web_security(web_config)
    except ConfigError as exc:
        print(f"headroom: {exc}", file=sys.stderr)
        return 2
    from ..history.store_open import store_damage, store_problem  # noqa: PLC0415 - no pandas: stays quick
    problem = store_problem(cfg.store_path) if cfg.store_path else None
    damage = store_damage(cfg.store_path) if cfg.store_path and not problem else None
    if damage:  # run starts with a fresh store: valid, and said
        print(f"headroom: {args.file}: store.path: {cfg.store_path} is {damage}: run will move it aside to "
              f"{cfg.store_path}.corrupt-<time> (kept) and start a fresh store", file=sys.stderr)
    if problem:
        print(f"headroom: {args.file}: store.path: {problem}: run would serve live numbers but write no "
              f"history (forecasts read what is there)", file=sys.stderr)
        return 1
    mode = "prometheus" if cfg.prometheus else "direct"
    print(f"{args.file}: valid ({mode} mode, {len(cfg.vllm_targets)} vLLM targets, "
          f"{len(cfg.gateways)} gateways, {len(cfg.dcgm_targets)} DCGM targets, interval {cfg.interval:g}s)")
    return 0
