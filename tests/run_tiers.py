"""Run test tiers one after the other and close with one line for all of them (the Makefile's test targets).

    python tests/run_tiers.py [--build-image] unit live engine image [--not-run engine] [-- PYTEST_ARGS...]

Tiers (tests/tiers.py says how a test gets its tier and how the marks are checked):
    unit    pytest -m "not live and not vllm", with HEADROOM_TEST_TIER=unit (no subprocess, no socket), as two
            processes: the files of UNIT_SHARDS in one, the rest in the other (tests/parallel.py); one process
            when PYTEST_ARGS name test files or folders
    live    pytest -m "live and not vllm and not image", the slowest files in two side processes (tests/parallel.py)
    engine  pytest -m vllm on ENGINE_FILES in one session (one shared engine; the LoRA engine last)
    image   pytest -m image on the files that use the mark: the container image run with podman as the Helm chart runs it
With --build-image, `bash image/build.sh` (make image) starts at once in the background, niced, with
its output in build/image-build.log, and the image tier waits for it: the build overlaps the other
tiers; a failed build fails the image tier with the log's last lines.
Every tier runs with HEADROOM_NO_SKIP=1: a skipped test fails, naming what was missing. Output streams
as it comes; the last lines give the ten slowest test files of the run, each tier's result and wall
time, then the totals as 'total: N passed, N failed', then, with --not-run, which tiers did not run and why.
Per-file durations (pytest's own reports, summed per file; every process of the unit and live tiers) go to
build/test-durations.json, one entry per tier, a tier's entry replaced each time that tier runs.
Exit status: 0 when every tier passed, else 1.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# the slowest files of the live tier, in two side processes beside the rest (tests/parallel.py), so the
# files that mostly wait (alerts' `for:` on real time, simulated fleets, promtool) overlap. Measured in a
# fresh clone's `.ci/run` here, 2026-12-06 (these groups less the last file of each): side 338 s and 341 s
# (test_alert_path 204, test_rules 176, test_loadtest_sim 146, test_demo 84), rest 430 s; the last files
# (32 s, 25 s) moved from the rest to even them
SIDE_SHARDS = [["tests/deploy/test_alert_path.py", "tests/lab/test_demo.py", "tests/sources/test_deadlines.py",
                "tests/app/test_restarts.py", "tests/app/test_snapshot_forecast.py",
                "tests/history/test_history_prometheus.py"],
               ["tests/lab/test_loadtest_sim.py", "tests/deploy/test_rules.py",
                "tests/app/test_prometheus_mode_forecasts.py", "tests/app/test_clock_steps_live.py"]]
# the unit tier as two pytest processes (tests/parallel.py), one per core: these files in one, the rest
# in the other, balanced by what each costs (build/test-durations.json has the seconds per file). Measured
# 2026-12-06 (CPU seconds of each process): these 53 s, and their waits (the mixed load tester's cases,
# ~7 s; mypy without its cache, ~7 s more in a fresh clone), the rest 63 s, collection of every file included
UNIT_SHARDS = [["tests/suite/test_lint.py", "tests/suite/test_dependencies.py", "tests/lab/test_loadtest_mixed.py",
                "tests/features/test_digest_day_one.py", "tests/features/test_digest_content.py",
                "tests/core/test_capacity_sim.py", "tests/lab/test_demo_story.py", "tests/lab/test_sim_workload.py",
                "tests/lab/test_sim_history.py", "tests/core/test_knee_plausible.py"]]
# one pytest session, two shared engines (tests/conftest.py: `vllm_small_engine`, and
# `vllm_priority_engine`, whose start-up overlaps the first one's)
ENGINE_FILES = ["tests/engine/test_vllm_pipeline.py", "tests/engine/test_vllm_sim_calibration.py",
                "tests/engine/test_capacity_vllm.py", "tests/engine/test_loadtest_vllm.py",
                "tests/engine/test_journey_vllm.py", "tests/engine/test_loadtest_mixed_vllm.py", "tests/engine/test_knee_vllm.py",
                "tests/engine/test_vllm_edges_engine.py"]


def image_files() -> list[str]:
    """The test files that carry the image mark (collecting only them saves the whole suite's collection)."""
    paths = [os.path.join(d, n) for d, _, names in os.walk(HERE) for n in names
             if n.startswith("test_") and n.endswith(".py")]
    return sorted(os.path.relpath(p, REPO) for p in paths if "pytest.mark.image" in _read(p))


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


TIERS = ("unit", "live", "engine", "image")
BUILD_LOG = os.path.join(REPO, "build", "image-build.log")
DURATIONS = os.path.join(REPO, "build", "test-durations.json")
SLOWEST = 10
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
_CLOSING = re.compile(r"^=*\s*(no tests ran|\d+ (passed|failed|errors?|skipped|deselected)\b.*\bin [\d.]+s)")


def _groups(shards: list[list[str]]) -> list[str]:
    """tests/parallel.py's arguments for the side processes: each shard's files, shards separated by `+`."""
    return [arg for n, files in enumerate(shards) for arg in ([] if n == 0 else ["+"]) + files]


def _names_tests(args: list[str]) -> bool:
    """Whether pytest's arguments name test files or folders (then they, not the shards, say what runs)."""
    return any(not a.startswith("-") and os.path.exists(os.path.join(REPO, a.split("::")[0])) for a in args)


# pytest's cache options: the side processes of tests/parallel.py run without the cache plugin (so two
# processes never write .pytest_cache at once), where these are unknown: with one, a tier runs in one process
CACHE_OPTIONS = ("--lf", "--last-failed", "--ff", "--failed-first", "--nf", "--new-first", "--cache-clear",
                 "--lfnf", "--last-failed-no-failures", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip",
                 "--cache-show")


def _one_process(args: list[str]) -> bool:
    """Whether pytest's arguments want the tier in one process: they name tests, or use the cache."""
    return _names_tests(args) or any(a.split("=")[0] in CACHE_OPTIONS for a in args)


def command(tier: str, args: list[str]) -> list[str]:
    py = sys.executable
    parallel = os.path.join(HERE, "parallel.py")
    if tier == "unit":
        if not UNIT_SHARDS or _one_process(args):
            return [py, "-m", "pytest", "-q", "-m", "not live and not vllm", *args]
        return [py, parallel, *_groups(UNIT_SHARDS), "--", "-q", "-m", "not live and not vllm", *args]
    if tier == "live":
        if _one_process(args):
            return [py, "-m", "pytest", "-q", "-m", "live and not vllm and not image", *args]
        return [py, parallel, *_groups(SIDE_SHARDS), "--", "-q", "-m", "live and not vllm and not image", *args]
    if tier == "image":
        return [py, "-m", "pytest", "-q", "-m", "image", *args, *image_files()]
    return [py, "-m", "pytest", "-q", "-m", "vllm", *args, *ENGINE_FILES]


def run_tier(tier: str, args: list[str]) -> tuple[int, dict, float]:
    env = {**os.environ, "HEADROOM_TEST_TIER": tier, "HEADROOM_NO_SKIP": "1", "PYTHONUNBUFFERED": "1",
           "HEADROOM_DURATIONS_DIR": _durations_dir(tier)}
    # byte-code caches kept: with PYTHONDONTWRITEBYTECODE set (some CI images set it) every pytest process
    # compiled the whole package again (collection 12 s of CPU instead of 4-5 s on 2 cores)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    shutil.rmtree(env["HEADROOM_DURATIONS_DIR"], ignore_errors=True)
    counts: dict = {}
    started = time.monotonic()
    proc = subprocess.Popen(command(tier, args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    pending = b""
    while True:  # pass the output through as it comes (pytest's dots have no newline)
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            _count(line.decode("utf-8", "replace").strip(), counts)
    _count(pending.decode("utf-8", "replace").strip(), counts)
    return proc.wait(), counts, time.monotonic() - started


def _count(line: str, counts: dict) -> None:
    if _CLOSING.match(line):  # a pytest closing line (two of them for the live tier)
        for n, what in _COUNT.findall(line):
            key = "error" if what.startswith("error") else what
            counts[key] = counts.get(key, 0) + int(n)


def _durations_dir(tier: str) -> str:
    return os.path.join(REPO, "build", "durations", tier)


def tier_durations(tier: str) -> dict:
    """{file: {"seconds", "tests"}} for one tier: the files each of its pytest processes wrote (tests/tiers.py)."""
    files: dict = {}
    directory = _durations_dir(tier)
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for path, row in json.load(f).items():
                seen = files.setdefault(path, {"seconds": 0.0, "tests": 0})
                seen["seconds"] = round(seen["seconds"] + row["seconds"], 3)
                seen["tests"] += row["tests"]
    return files


def record_durations(results: list) -> list[tuple[float, str, str]]:
    """Write the tiers just run into build/test-durations.json (keeping the other tiers' entries);
    the (seconds, file, tier) rows of this run, slowest first."""
    try:
        with open(DURATIONS, encoding="utf-8") as f:
            book = json.load(f)
    except (OSError, ValueError):
        book = {}
    rows = []
    for tier, _code, _counts, seconds in results:
        files = tier_durations(tier)
        book[tier] = {"finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "wall_seconds": round(seconds, 1), "files": dict(sorted(files.items()))}
        rows += [(row["seconds"], path, tier) for path, row in files.items()]
    os.makedirs(os.path.dirname(DURATIONS), exist_ok=True)
    with open(DURATIONS, "w", encoding="utf-8") as f:
        json.dump(dict(sorted(book.items())), f, indent=1)
    return sorted(rows, reverse=True)


def start_image_build() -> subprocess.Popen:
    """`make image` in the background at the lowest CPU priority, so the tiers running meanwhile keep theirs."""
    os.makedirs(os.path.dirname(BUILD_LOG), exist_ok=True)
    log = open(BUILD_LOG, "wb")  # the child holds it; closed when awaited
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    print(f"image build started in the background (log: {os.path.relpath(BUILD_LOG, REPO)})", flush=True)
    return subprocess.Popen(["nice", "-n", "19", "bash", os.path.join(REPO, "image", "build.sh")], cwd=REPO,
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def await_image_build(build: subprocess.Popen, started: float) -> bool:
    code = build.wait()
    with open(BUILD_LOG, "rb") as f:
        tail = f.read().decode("utf-8", "replace").splitlines()[-15:]
    print(f"image build: exit {code} after {time.monotonic() - started:.0f} s wall", flush=True)
    for line in tail if code else tail[-1:]:
        print(f"  {line}", flush=True)
    return code == 0


def main(argv: list[str]) -> int:
    args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, args = argv[:i], argv[i + 1:]
    not_run: list[str] = []
    while "--not-run" in argv:
        i = argv.index("--not-run")
        not_run.append(argv[i + 1])
        del argv[i:i + 2]
    build = None
    if "--build-image" in argv:
        argv.remove("--build-image")
        build, build_started = start_image_build(), time.monotonic()
    tiers = [t for t in argv if t]
    bad = [t for t in tiers + not_run if t not in TIERS]
    if not tiers or bad:
        print(f"usage: run_tiers.py {{{'|'.join(TIERS)}}}... [--not-run TIER] [-- PYTEST_ARGS]"
              + (f" (unknown tier: {', '.join(bad)})" if bad else ""), file=sys.stderr)
        return 2
    results = []
    for tier in tiers:
        print(f"\n===== tier {tier} =====", flush=True)
        if tier == "image" and build is not None and not await_image_build(build, build_started):
            results.append((tier, 1, {"error": 1}, time.monotonic() - build_started))
            continue
        results.append((tier, *run_tier(tier, [a for a in args if a])))
    slowest = record_durations(results)
    print(f"\nslowest test files (set-up + call + teardown; all in {os.path.relpath(DURATIONS, REPO)}):")
    for seconds, path, tier in slowest[:SLOWEST]:
        print(f"  {seconds:7.1f} s  {path} ({tier})")
    total_passed = sum(c.get("passed", 0) for _, _, c, _ in results)
    total_failed = sum(c.get("failed", 0) + c.get("error", 0) for _, _, c, _ in results)
    print()
    for tier, code, counts, seconds in results:
        shown = ", ".join(f"{v} {k}" for k, v in counts.items()) or "no closing line"
        print(f"tier {tier}: exit {code}, {shown}, {seconds:.0f} s wall")
    ok = all(code == 0 for _, code, _, _ in results)
    print(f"total: {total_passed} passed, {total_failed} failed")
    if not_run:
        print(f"NOT RUN: the {', '.join(not_run)} tier{'s' if len(not_run) > 1 else ''} "
              "(opted out: SKIP_ENGINES=1); this is not the whole suite")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
