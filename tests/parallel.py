"""Run a pytest suite as several pytest processes at once: each group of the given files in one
(groups separated by `+`), everything else in another.

    python tests/parallel.py tests/lab/test_demo.py + tests/deploy/test_rules.py -- -q -m "not vllm"

The non-engine suite mostly waits (real Prometheus, Alertmanager and promtool, simulated fleets
running in real time, the 60-s demo): one pytest process used about 20 % of a core over 12 minutes.
Its slowest files in side processes cut the wall time without a plugin: the files that mostly wait
(alerts' `for:` on real time, simulated fleets) overlap. The unit tier, all CPU, runs as two such
processes, one per core (UNIT_SHARDS in tests/run_tiers.py). Each process gets its own --basetemp (pytest
prunes old numbered temp dirs, which must not be another process's), the side processes run without
the cache plugin (one writer of .pytest_cache), and every log is printed in full once all are done;
the temporary files are removed after a pass and kept (path printed) after a failure. Exit status: 0
when all passed (or some passed and the others had nothing selected), else the first non-zero one.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

NO_TESTS = 5  # pytest's exit status when nothing was collected or selected


def split_args(argv: list[str]) -> tuple[list[list[str]], list[str]]:
    """(the side processes' groups of files, pytest's arguments)."""
    if "--" not in argv:
        raise SystemExit("usage: parallel.py FILE... [+ FILE...]... -- PYTEST_ARGS...  "
                         "(each side process's test files, then pytest's arguments)")
    i = argv.index("--")
    groups: list[list[str]] = [[]]
    for item in argv[:i]:
        if item == "+":
            groups.append([])
        else:
            groups[-1].append(item)
    files = [f for g in groups for f in g]
    missing = [f for f in files if not os.path.isfile(f)]
    if not all(groups) or missing:
        raise SystemExit(f"parallel.py: no such test file: {', '.join(missing) or '(an empty group)'}")
    return groups, argv[i + 1:]


def main(argv: list[str]) -> int:
    groups, args = split_args(argv)
    base = tempfile.mkdtemp(prefix="headroom-pytest-")
    pytest = [sys.executable, "-m", "pytest", *args]
    runs = [("side: " + " ".join(files), [*pytest, "-p", "no:cacheprovider", f"--basetemp={base}/side{n}", *files])
            for n, files in enumerate(groups)]
    runs.append(("rest", [*pytest, f"--basetemp={base}/rest", *[f"--ignore={f}" for g in groups for f in g]]))
    started = time.monotonic()
    procs = []
    for name, cmd in runs:
        log = open(os.path.join(base, f"{len(procs)}.log"), "w+")
        procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    codes = []
    for name, proc, log in procs:
        codes.append(proc.wait())
        log.seek(0)
        sys.stdout.write(f"===== pytest ({name}): exit {codes[-1]}, done after "
                         f"{time.monotonic() - started:.0f} s =====\n{log.read()}")
        sys.stdout.flush()
        log.close()
    if 0 in codes and set(codes) <= {0, NO_TESTS}:
        shutil.rmtree(base, ignore_errors=True)
        return 0  # a -k or -m filter that selects nothing in one process is not a failure
    sys.stdout.write(f"pytest's temporary files and every log are kept in {base}\n")
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
