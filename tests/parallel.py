"""Run a pytest suite as two pytest processes at once: the given files in one, everything else in the other.

    python tests/parallel.py tests/lab/test_demo.py tests/lab/test_loadtest_sim.py -- -q -m "not vllm"

The non-engine suite mostly waits (real Prometheus, Alertmanager and promtool, simulated fleets
running in real time, the 60-s demo): one pytest process used about 20 % of a core over 12 minutes.
Its slowest files in a second process cut the wall time without a plugin. Each process gets its own
--basetemp (pytest prunes old numbered temp dirs, which must not be the other process's), the side
process runs without the cache plugin (one writer of .pytest_cache), and both logs are printed in
full once both are done; the temporary files are removed after a pass and kept (path printed) after
a failure. Exit status: 0 when both passed (or one passed and the other had nothing selected), else
the first non-zero one.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

NO_TESTS = 5  # pytest's exit status when nothing was collected or selected


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: parallel.py FILE... -- PYTEST_ARGS...  "
                         "(the side process's test files, then pytest's arguments)")
    i = argv.index("--")
    files, args = argv[:i], argv[i + 1:]
    missing = [f for f in files if not os.path.isfile(f)]
    if not files or missing:
        raise SystemExit(f"parallel.py: no such test file: {', '.join(missing) or '(none given)'}")
    return files, args


def main(argv: list[str]) -> int:
    files, args = split_args(argv)
    base = tempfile.mkdtemp(prefix="headroom-pytest-")
    pytest = [sys.executable, "-m", "pytest", *args]
    side = [*pytest, "-p", "no:cacheprovider", f"--basetemp={base}/side", *files]
    rest = [*pytest, f"--basetemp={base}/rest", *[f"--ignore={f}" for f in files]]
    started = time.monotonic()
    procs = []
    for name, cmd in (("side: " + " ".join(files), side), ("rest", rest)):
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
    sys.stdout.write(f"pytest's temporary files and both logs are kept in {base}\n")
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
