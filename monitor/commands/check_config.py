"""`headroom check-config FILE`: validate a configuration file (exit 0 when valid, 2 when not)."""
from __future__ import annotations

import sys

from ..config import ConfigError, load


def add_arguments(p) -> None:
    p.add_argument("file", help="configuration file (YAML)")


def run(args) -> int:
    try:
        cfg = load(args.file)
    except ConfigError as exc:
        print(f"headroom: invalid configuration: {exc}", file=sys.stderr)
        return 2
    mode = "prometheus" if cfg.prometheus else "direct"
    print(f"{args.file}: valid ({mode} mode, {len(cfg.vllm_targets)} vLLM targets, "
          f"{len(cfg.gateways)} gateways, {len(cfg.dcgm_targets)} DCGM targets, interval {cfg.interval:g}s)")
    return 0
