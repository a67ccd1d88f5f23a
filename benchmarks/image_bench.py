"""The container image: its size and what takes the space, the time from `podman run` to `/-/ready` 200,
and (with --build) what `make image` costs warm and cold. Writes benchmarks/image_results.json.

Each ready trial runs the image exactly as the image tier does (tests/podman_pod.py: flags from the
Helm chart's rendered Deployment) against a simulated fleet on loopback, with a fresh data volume, and
times the wall seconds from the `podman run` call to the first 200 of the readiness probe path.
`--build` times `bash image/build.sh` twice: with the caches in place (warm), then with the base
tarball, the base image and the wheel cache removed (cold: mmdebstrap, wheel downloads, buildah).

    .venv/bin/python benchmarks/image_bench.py [--trials 5] [--build]     (after make image)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "deploy"))
from podman_pod import PodmanPod, podman  # noqa: E402
from servers import free_port  # noqa: E402
from test_image import SECRET, SITE, image_ref, render  # noqa: E402

from headroom_lab.sim.server import start_fleet  # noqa: E402

CACHE = Path(os.environ.get("HEADROOM_CACHE", Path.home() / ".cache" / "headroom"))


def size_report() -> dict:
    (info,) = json.loads(podman("image", "inspect", image_ref()).stdout)
    layers = json.loads(podman("history", "--format=json", image_ref()).stdout)
    script = (f"cd {SITE} && du -sk * | sort -rn | head -12; echo ---; du -sk /opt/headroom /usr/lib "
              "/usr/share /usr/bin 2>/dev/null")
    out = podman("run", "--rm", "--network=host", "--entrypoint=sh", image_ref(), "-c", script).stdout
    top, _, dirs = out.partition("---")
    kb = lambda text: {ln.split()[1]: int(ln.split()[0]) // 1024 for ln in text.strip().splitlines()}  # noqa: E731
    return {"image_mb": round(info["Size"] / 1e6), "layers_mb": [round(h.get("size", 0) / 1e6) for h in layers
                                                                   if h.get("size")],
            "site_packages_top_mb": kb(top), "dirs_mb": kb(dirs)}


def ready_trial(fleet) -> float:
    root = Path(tempfile.mkdtemp(prefix="headroom-image-bench-"))
    objects = render(free_port(), fleet)
    (workload,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    pod = PodmanPod(workload, objects, root, {SECRET: {"token": "bench\n"}}, pod_name=f"headroom-bench-{os.getpid()}")
    url = pod.probe_url("readinessProbe")
    try:
        started = pod.start()
        while time.time() - started < 120:
            try:
                if requests.get(url, timeout=2).status_code == 200:
                    return time.time() - started
            except requests.RequestException:
                pass
            time.sleep(0.02)
        raise RuntimeError("not ready within 120 s")
    finally:
        pod.remove()
        shutil.rmtree(root, ignore_errors=True)


def build_time(cold: bool) -> float:
    if cold:
        for sub in ("image-base", "image-wheels"):
            shutil.rmtree(CACHE / sub, ignore_errors=True)
        for ref in podman("images", "--format={{.Repository}}:{{.Tag}}", "localhost/headroom-base").stdout.split():
            podman("rmi", "--force", ref, check=False)
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "image" / "build.sh")], check=True, cwd=REPO,
                   env={**os.environ, "PYTHON": sys.executable})
    return round(time.monotonic() - t0, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--build", action="store_true", help="also time make image, warm then cold")
    args = ap.parse_args()
    out = {"what": "the container image (benchmarks/image_bench.py)", "image": image_ref()}
    if args.build:
        out["build_s"] = {"warm": build_time(cold=False), "cold": build_time(cold=True)}
    out["size"] = size_report()
    fleet = start_fleet(None, "steady", seed=11, warmup_s=60)
    try:
        ready = [round(ready_trial(fleet), 2) for _ in range(args.trials)]
    finally:
        fleet.stop()
    out["ready_s"] = {"trials": ready, "median": statistics.median(ready), "worst": max(ready)}
    out["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "podman": podman("--version").stdout.strip(), "load_1m": os.getloadavg()[0]}
    path = REPO / "benchmarks" / "image_results.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
