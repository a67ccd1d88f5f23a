"""Copy the rules and dashboards into the Helm chart (Helm cannot read files outside the chart).

    python helm/sync.py            # write helm/headroom/files/{rules,dashboards}/ from the sources
    python helm/sync.py --check    # exit 1 and list the differences when the copies drifted

Sources (whatever exists, nothing is hard-coded):
- rules: every top-level `rules/*.yml` / `rules/*.yaml` whose YAML has a `groups:` list (promtool
  unit-test files, which have `rule_files:` instead, are not rule files and are left out);
- dashboards: every `grafana/dashboards/*.json`.
Copies are byte-for-byte; copies whose source is gone are removed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "headroom"


def rule_sources(repo: Path = REPO) -> list[Path]:
    found = []
    rules_dir = repo / "rules"
    for path in sorted(rules_dir.glob("*.y*ml")) if rules_dir.is_dir() else []:
        if path.suffix not in (".yml", ".yaml") or not path.is_file():
            continue
        doc = yaml.safe_load(path.read_bytes())
        if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
            found.append(path)
    return found


def dashboard_sources(repo: Path = REPO) -> list[Path]:
    dash_dir = repo / "grafana" / "dashboards"
    found = sorted(p for p in dash_dir.glob("*.json") if p.is_file()) if dash_dir.is_dir() else []
    for path in found:
        json.loads(path.read_bytes())  # a broken dashboard fails here, not inside Helm
    return found


def plan(repo: Path = REPO, chart: Path = CHART) -> dict[Path, Path | None]:
    """target -> source (None: a stale copy to delete)."""
    wanted: dict[Path, Path | None] = {}
    for sources, sub, patterns in (
        (rule_sources(repo), "rules", ("*.yml", "*.yaml")),
        (dashboard_sources(repo), "dashboards", ("*.json",)),
    ):
        target_dir = chart / "files" / sub
        for src in sources:
            wanted[target_dir / src.name] = src
        for pattern in patterns:
            for existing in sorted(target_dir.glob(pattern)) if target_dir.is_dir() else []:
                wanted.setdefault(existing, None)
    return wanted


def drift(repo: Path = REPO, chart: Path = CHART) -> list[str]:
    problems = []
    for target, src in plan(repo, chart).items():
        rel = target.relative_to(chart)
        if src is None:
            problems.append(f"{rel}: stale copy, its source is gone")
        elif not target.exists():
            problems.append(f"{rel}: missing copy of {src.relative_to(repo)}")
        elif target.read_bytes() != src.read_bytes():
            problems.append(f"{rel}: differs from {src.relative_to(repo)}")
    return problems


def sync(repo: Path = REPO, chart: Path = CHART) -> list[str]:
    changed = []
    for target, src in plan(repo, chart).items():
        rel = str(target.relative_to(chart))
        if src is None:
            target.unlink()
            changed.append(f"removed {rel}")
        elif not target.exists() or target.read_bytes() != src.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
            changed.append(f"wrote {rel}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run: python helm/sync.py", file=sys.stderr)
        return 1 if problems else 0
    for line in sync():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
