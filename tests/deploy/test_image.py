"""The container image (`make image`: localhost/headroom:dev) run with podman exactly as the Helm chart's
rendered Deployment runs it, against a simulated fleet on loopback (the image tier: `make test-image`).

The podman flags come from `helm template` output (the chart rendered by the real Helm engine, as in
test_helm.py) through tests/podman_pod.py, never retyped: args, env, the ConfigMap and Secret mounts,
runAsNonRoot, readOnlyRootFilesystem, dropped capabilities, the memory limit, ports and probe paths.
The image must exist: build it with `make image` (`make test` builds it in the background meanwhile).
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest
import requests
import yaml
from podman_pod import PodmanPod, podman
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, wait_for

from headroom_lab.sim.server import start_fleet

helm_chart = pytest.importorskip("helm_python.chart", reason="pip install helm-python-sdk")
from helm_python.chart import Chart  # noqa: E402

pytestmark = [pytest.mark.live, pytest.mark.image]  # tests/tiers.py: the image tier

REPO = Path(__file__).resolve().parents[2]
IMAGE = {"registry": "localhost", "repository": "headroom", "tag": "dev"}  # what `make image` builds
SECRET = "fleet-token"
MAX_IMAGE_BYTES = 600_000_000
# what the runtime image must not hold (the simulator and load tester ship in headroom-lab)
LAB_PATHS = ("monitor/sim", "monitor/loadtest", "headroom_lab")
SITE = "/opt/headroom/lib/python3.11/site-packages"


def image_ref() -> str:
    return f"{IMAGE['registry']}/{IMAGE['repository']}:{IMAGE['tag']}"


@pytest.fixture(scope="module")
def image() -> dict:
    found = podman("image", "inspect", image_ref(), check=False)
    assert found.returncode == 0, f"no image {image_ref()}: build it with `make image` ({found.stderr.strip()})"
    (info,) = json.loads(found.stdout)
    return info


# paths (relative to the image's site-packages) the checks below ask about
PROBED = ("pip", "setuptools", "../../../bin/pip", "monitor/commands/cli.py", "monitor/export", "monitor/nothing-here",
          *LAB_PATHS)
INSIDE = f"""
import importlib.metadata as m, json, os, sys
print(json.dumps({{"paths": [p for p in sys.argv[1:] if os.path.exists(os.path.join({SITE!r}, p))],
                  "dists": {{d.metadata["Name"]: d.version for d in m.distributions()}}}}))
"""


@pytest.fixture(scope="module")
def inside(image) -> dict:
    """What the image holds: which PROBED paths exist, every installed distribution (one podman run)."""
    out = podman("run", "--rm", "--network=host", "--entrypoint=python3", image_ref(), "-c", INSIDE, *PROBED)
    return json.loads(out.stdout)


def present(inside: dict, paths) -> list[str]:
    """Which of `paths` exist in the image's site-packages (each must be one of PROBED)."""
    assert set(paths) <= set(PROBED), "add the path to PROBED"
    return [p for p in paths if p in inside["paths"]]


def test_image_runs_headroom_as_the_charts_numeric_user_and_is_small(image, inside):
    cfg = image["Config"]
    assert cfg["Entrypoint"] == ["headroom"]
    uid, _, gid = cfg["User"].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), "USER must be numeric and not root (runAsNonRoot)"
    values = yaml.safe_load((REPO / "helm" / "headroom" / "values.yaml").read_text())
    assert int(uid) == values["securityContext"]["runAsUser"] and int(gid) == values["securityContext"]["runAsGroup"]
    assert image["Size"] < MAX_IMAGE_BYTES, f"image is {image['Size'] / 1e6:.0f} MB"
    # no packaging tools in the running image
    assert present(inside, ["pip", "setuptools", "../../../bin/pip"]) == []


def test_image_holds_exactly_the_pinned_versions(inside):
    pins = dict(line.split("==") for line in (REPO / "image" / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    norm = lambda pairs: {k.lower().replace("_", "-"): v for k, v in pairs}  # noqa: E731
    installed, pins = norm(inside["dists"].items()), norm(pins.items())
    assert installed.pop("headroom") == re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(),
                                                   re.M).group(1)
    assert installed == pins  # every package pinned, at its pinned version, nothing else


def test_the_lab_check_finds_what_the_image_holds(inside):
    # the check below, pointed at paths that exist in every runtime image: it does find them
    assert present(inside, ["monitor/commands/cli.py", "monitor/export", "monitor/nothing-here"]) == [
        "monitor/commands/cli.py", "monitor/export"]


def test_image_holds_no_simulator_or_load_tester(inside):
    assert present(inside, LAB_PATHS) == []


# ------------------------------------------------------------------ the chart's Deployment in podman


def render(port: int, fleet) -> list[dict]:
    targets = [u for urls in fleet.replica_urls.values() for u in urls]
    values = {"image": IMAGE, "service": {"port": port},
              "secrets": {"prometheus": {"existingSecret": SECRET}},
              "config": {"global": {"interval": "1s"},
                         "sources": {"prometheus": None,
                                     "vllm": {"targets": targets,
                                              "bearer_token_file": "/etc/headroom/secrets/prometheus/token"}}}}
    with Chart.load(REPO / "helm" / "headroom") as chart:
        manifests = chart.render(values, name="ci", namespace="monitoring")
    return [d for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def store_points(data_dir: Path) -> set:
    path = data_dir / "history.sqlite"
    if not path.exists():
        return set()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return set(db.execute("SELECT pool, series, res, ts FROM points").fetchall())
    except sqlite3.OperationalError:  # created, no table yet
        return set()
    finally:
        db.close()


def pools_served(url: str) -> dict[str, float]:
    text = requests.get(url, timeout=5).text
    return {s.labels["pool"]: s.value for fam in text_string_to_metric_families(text)
            if fam.name == "headroom_replicas" for s in fam.samples}


@pytest.fixture(scope="module")
def pod(image, tmp_path_factory):
    fleet = start_fleet(None, "steady", seed=11, warmup_s=60)
    root = tmp_path_factory.mktemp("pod")
    objects = render(free_port(), fleet)
    (workload,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    p = PodmanPod(workload, objects, root, {SECRET: {"token": "not-a-real-token\n"}},
                  pod_name=f"headroom-image-test-{os.getpid()}")
    p.fleet = fleet
    p.remove()  # a container left by an interrupted run under the same name
    try:
        yield p
    finally:
        p.remove()
        fleet.stop()


def wait_ready(p: PodmanPod, timeout: float = 120) -> None:
    def ready():
        assert p.running(), "the container exited: " + podman("logs", p.name, check=False).stderr[-2000:]
        return requests.get(p.probe_url("readinessProbe"), timeout=5).status_code
    wait_for(ready, lambda code: code == 200, timeout, "the readiness probe answers 200")


def test_the_charts_deployment_runs_in_podman(pod):
    assert pod.run_as_non_root() and "--read-only" in pod.run_args()
    args = pod.run_args()
    assert "--cap-drop=ALL" in args and "--security-opt=no-new-privileges" in args
    started = pod.start()
    wait_ready(pod)
    ready_s = time.time() - started
    assert requests.get(pod.probe_url("livenessProbe"), timeout=5).status_code == 200
    ids = podman("exec", pod.name, "id", "-u").stdout.split()
    assert ids == [str(pod.sc["runAsUser"])]
    metrics = pod.probe_url("readinessProbe").replace("/-/ready", "/metrics")
    models = {p.name: p.model_name for p in pod.fleet.fleet.config.pools}  # headroom's pool: the served model
    want = {models[pool]: float(len(urls)) for pool, urls in pod.fleet.replica_urls.items()}
    wait_for(lambda: pools_served(metrics), lambda got: got == want, 60, f"headroom_replicas for {want}")
    data = pod.root / "data"
    before = wait_for(lambda: store_points(data), bool, 60, "points in the store on the data volume")
    print(f"ready {ready_s:.1f} s after podman run; {len(before)} points stored")

    took, code = pod.terminate()
    print(f"SIGTERM: exit {code} after {took:.2f} s")
    assert code == 0 and took < 5.0, f"SIGTERM: exit {code} after {took:.1f} s"
    # nothing written outside the volumes: the root filesystem is unchanged
    assert pod.rootfs_changes() == []
    kept = store_points(data)
    assert before <= kept

    pod.start()  # the same container restarted (the kubelet's restart): same volumes
    wait_ready(pod)
    after = wait_for(lambda: store_points(data), lambda pts: len(pts) > len(kept), 60, "new points after restart")
    assert kept <= after, f"{len(kept - after)} points lost over the restart"
    took, code = pod.terminate()
    print(f"SIGTERM after the restart: exit {code} after {took:.2f} s")
    assert code == 0 and took < 5.0, f"SIGTERM after the restart: exit {code} after {took:.1f} s"
    assert pod.rootfs_changes() == []
    owners = {f.stat().st_uid for f in data.iterdir()}
    assert owners == {pod.sc["runAsUser"]}, f"store files owned by {owners}"
