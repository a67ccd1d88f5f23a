"""`headroom check-config FILE`: validate a configuration file (exit 0 when valid, 2 when not)."""
from __future__ import annotations

import sys

from ..config import ConfigError, load


def add_arguments(p) -> None:
    p.add_argument("file", help="configuration file (YAML)")


def run(args) -> int:
    try:
        cfg = load(args.file)
        from ..wiring import default_enrichers  # capacity: and slos: are validated by their owners
        default_enrichers(cfg)
        if cfg.digest:
            from ..digest.settings import from_dict as digest_settings
            digest_settings(cfg.digest, cfg.file, cfg.slos)
    except ConfigError as exc:
        print(f"headroom: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"headroom: invalid configuration: {args.file}: {exc}", file=sys.stderr)
        return 2
    mode = "prometheus" if cfg.prometheus else "direct"
    print(f"{args.file}: valid ({mode} mode, {len(cfg.vllm_targets)} vLLM targets, "
          f"{len(cfg.gateways)} gateways, {len(cfg.dcgm_targets)} DCGM targets, interval {cfg.interval:g}s)")
    return 0
