"""Run a pod's container from a rendered Kubernetes workload with podman, the way a kubelet would.

`PodmanPod(workload, objects, root)` reads the pod template of a rendered Deployment / StatefulSet
(`helm template` output) and translates what the kubelet would do into podman flags: the container's
image, command/args, env (values and the downward API's pod name / namespace), the pod's and the
container's securityContext (user, group, fsGroup, runAsNonRoot, readOnlyRootFilesystem, dropped
capabilities, no privilege escalation, seccomp), the memory limit, ports and probes, and every
volumeMount: a ConfigMap or Secret volume becomes files under `root` (Secrets with their defaultMode,
group-owned by the fsGroup, as the kubelet writes them), an emptyDir a directory under `root` that
outlives a restart of the container (as an emptyDir outlives one in a pod).
Anything in the pod spec it does not know how to translate raises `Untranslated` naming it, so a new
field in the chart cannot be silently left out. These machines need `--network host` (infrastructure
notes): the pod's ports are then the host's, so a test gives the chart a free port.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Optional

CONTAINERS_CONF = Path(__file__).resolve().parents[1] / "image" / "containers.conf"
# what the translation reads (or knowingly ignores: nothing a single host can mean, e.g. scheduling)
POD_FIELDS = {"serviceAccountName", "automountServiceAccountToken", "securityContext", "containers",
              "volumes", "terminationGracePeriodSeconds", "affinity", "nodeSelector", "tolerations",
              "topologySpreadConstraints", "priorityClassName", "imagePullSecrets"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports", "livenessProbe",
                    "readinessProbe", "resources", "securityContext", "volumeMounts", "workingDir"}


class Untranslated(AssertionError):
    """A field of the rendered pod that this translation does not cover."""


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}... exit {result.returncode}: {result.stderr[-1500:]}")
    return result


def _quantity_bytes(q: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|K|M|G)?", str(q))
    if not m:
        raise Untranslated(f"memory quantity {q!r}")
    mult = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[m.group(2)]
    return int(m.group(1)) * mult


class PodmanPod:
    def __init__(self, workload: dict, objects: list[dict], root: Path, secret_data: dict[str, dict],
                 pod_name: str, container: str = "headroom"):
        self.spec = workload["spec"]["template"]["spec"]
        self.namespace = workload["metadata"].get("namespace", "default")
        unknown = set(self.spec) - POD_FIELDS
        if unknown:
            raise Untranslated(f"pod spec fields {sorted(unknown)}")
        self.c = next(c for c in self.spec["containers"] if c["name"] == container)
        if set(self.c) - CONTAINER_FIELDS:
            raise Untranslated(f"container fields {sorted(set(self.c) - CONTAINER_FIELDS)}")
        self.objects, self.root, self.secret_data, self.name = objects, root, secret_data, pod_name
        pod_sc, sc = self.spec.get("securityContext", {}), self.c.get("securityContext", {})
        self.sc = {**pod_sc, **sc}  # the container's settings win, as in Kubernetes
        self.fs_group: Optional[int] = pod_sc.get("fsGroup")
        self.ports = {p["name"]: p["containerPort"] for p in self.c.get("ports", [])}

    # ------------------------------------------------------------------ flags
    def security_flags(self) -> list[str]:
        sc, flags = self.sc, []
        uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
        if uid is not None:
            flags.append(f"--user={uid}:{gid if gid is not None else 0}")
        if self.fs_group is not None:
            flags.append(f"--group-add={self.fs_group}")
        if sc.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]  # no tmpfs podman adds by itself
        if sc.get("allowPrivilegeEscalation") is False:
            flags.append("--security-opt=no-new-privileges")
        if sc.get("privileged"):
            flags.append("--privileged")
        caps = sc.get("capabilities", {})
        flags += [f"--cap-drop={c}" for c in caps.get("drop", [])] + [f"--cap-add={c}" for c in caps.get("add", [])]
        seccomp = sc.get("seccompProfile", {}).get("type", "RuntimeDefault")
        if seccomp == "Unconfined":
            flags.append("--security-opt=seccomp=unconfined")
        elif seccomp != "RuntimeDefault":
            raise Untranslated(f"seccompProfile {seccomp}")
        return flags

    def run_as_non_root(self) -> bool:
        return bool(self.sc.get("runAsNonRoot"))

    def env_flags(self) -> list[str]:
        flags = []
        for e in self.c.get("env", []):
            if "value" in e:
                flags.append(f"--env={e['name']}={e['value']}")
                continue
            path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            known = {"metadata.name": self.name, "metadata.namespace": self.namespace}
            if path not in known:
                raise Untranslated(f"env {e['name']}: {e.get('valueFrom')}")
            flags.append(f"--env={e['name']}={known[path]}")
        return flags

    def resource_flags(self) -> list[str]:
        limits = self.c.get("resources", {}).get("limits", {})
        if set(limits) - {"memory", "cpu"}:
            raise Untranslated(f"resource limits {sorted(limits)}")
        flags = [f"--memory={_quantity_bytes(limits['memory'])}"] if "memory" in limits else []
        return flags + ([f"--cpus={limits['cpu']}"] if "cpu" in limits else [])

    def volume_flags(self) -> list[str]:
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        flags = []
        for m in self.c.get("volumeMounts", []):
            host = self._materialize(volumes[m["name"]], m.get("subPath"))
            flags.append(f"--volume={host}:{m['mountPath']}:{'ro' if m.get('readOnly') else 'rw'}")
        return flags

    def _materialize(self, volume: dict, sub_path: Optional[str]) -> Path:
        base = self.root / volume["name"]
        if "configMap" in volume or "secret" in volume:
            if "configMap" in volume:
                data = self._object("ConfigMap", volume["configMap"]["name"])["data"]
                mode = volume["configMap"].get("defaultMode", 0o644)
            else:
                data = self.secret_data[volume["secret"]["secretName"]]
                mode = volume["secret"].get("defaultMode", 0o644)
            base.mkdir(parents=True, exist_ok=True)
            for key, text in data.items():
                path = base / key
                path.write_text(text)
                path.chmod(mode)
                if self.fs_group is not None and os.geteuid() == 0:
                    os.chown(path, 0, self.fs_group)
            return base / sub_path if sub_path else base
        if "emptyDir" in volume or "persistentVolumeClaim" in volume:
            base.mkdir(parents=True, exist_ok=True)
            base.chmod(0o777)  # the kubelet's emptyDir mode
            if self.fs_group is not None and os.geteuid() == 0:
                os.chown(base, 0, self.fs_group)
                base.chmod(0o2777)
            return base / sub_path if sub_path else base
        raise Untranslated(f"volume {volume['name']}: {sorted(volume)}")

    def _object(self, kind: str, name: str) -> dict:
        (obj,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        return obj

    def check_non_root(self) -> None:
        """The kubelet's runAsNonRoot check: the user the container will run as (runAsUser, else the
        image's USER) must be numeric and not 0, or the pod does not start."""
        if not self.run_as_non_root():
            return
        uid = self.sc.get("runAsUser")
        if uid is None:
            user = podman("image", "inspect", "--format={{.Config.User}}", self.c["image"]).stdout.strip()
            uid = int(user.split(":")[0]) if user.split(":")[0].isdigit() else None
        if uid in (None, 0):
            raise AssertionError(f"runAsNonRoot: the container would run as {uid!r}; the kubelet refuses it")

    def run_args(self) -> list[str]:
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        args = ["run", "--detach", "--pull=never", "--network=host", f"--name={self.name}",
                f"--hostname={self.name}", f"--stop-timeout={grace}",
                *self.security_flags(), *self.env_flags(), *self.resource_flags(), *self.volume_flags()]
        if self.c.get("workingDir"):
            args.append(f"--workdir={self.c['workingDir']}")
        if self.c.get("command"):
            args.append("--entrypoint=" + json.dumps(self.c["command"]))
        return [*args, self.c["image"], *self.c.get("args", [])]

    # ------------------------------------------------------------------ probes
    def probe_url(self, which: str) -> str:
        get = self.c[which]["httpGet"]
        port = self.ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        return f"{get.get('scheme', 'HTTP').lower()}://127.0.0.1:{port}{get['path']}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> float:
        """`podman run` (first time) or `podman start` (a restart of the same container, same volumes);
        returns the wall time it was called at."""
        t0 = time.time()
        if podman("container", "exists", self.name, check=False).returncode == 0:
            podman("start", self.name)
        else:
            self.check_non_root()
            podman(*self.run_args())
        return t0

    def terminate(self, timeout: float = 60) -> tuple[float, int]:
        """SIGTERM as the kubelet sends it; returns (seconds from the signal to the exit, exit code)."""
        t0 = time.time()
        podman("kill", "--signal=TERM", self.name)
        code = int(podman("wait", self.name, timeout=timeout).stdout.strip())
        finished = podman("inspect", "--format={{.State.FinishedAt.Unix}}.{{.State.FinishedAt.Nanosecond}}",
                          self.name).stdout.strip()
        sec, _, ns = finished.partition(".")
        return int(sec) + int(ns) / 1e9 - t0, code

    def rootfs_changes(self) -> list[str]:
        """`podman diff` of the container, less the mount points (and their parent directories) the
        runtime itself creates for the volumes: what the process wrote to its root filesystem."""
        made = set()
        for m in self.c.get("volumeMounts", []):
            path = m["mountPath"].rstrip("/")
            while path:
                made.add(path)
                path = path.rsplit("/", 1)[0]
        lines = podman("diff", self.name).stdout.splitlines()
        return [ln for ln in lines if ln.split(maxsplit=1)[-1] not in made]

    def running(self) -> bool:
        out = podman("inspect", "--format={{.State.Running}}", self.name, check=False).stdout.strip()
        return out == "true"

    def remove(self) -> None:
        podman("rm", "--force", "--time=0", self.name, check=False)
