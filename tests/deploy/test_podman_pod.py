"""tests/podman_pod.py: the translation of a pod template into podman flags (no podman runs here; the image
tier runs the chart's real Deployment with it)."""
from __future__ import annotations

import copy
import os
import stat

import pytest
from podman_pod import PodmanPod, Untranslated

WORKLOAD = {
    "kind": "Deployment",
    "metadata": {"name": "x", "namespace": "monitoring"},
    "spec": {"template": {"spec": {
        "terminationGracePeriodSeconds": 20,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
        "containers": [{
            "name": "headroom", "image": "localhost/headroom:dev", "args": ["run", "--web.listen-address=:9999"],
            "env": [{"name": "A", "value": "1"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [{"name": "http-metrics", "containerPort": 9999}],
            "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "http-metrics"}},
            "resources": {"limits": {"memory": "1Gi"}},
            "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}, "runAsUser": 1000},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/h/h.yml", "subPath": "h.yml", "readOnly": True},
                             {"name": "data", "mountPath": "/var/lib/h"},
                             {"name": "token", "mountPath": "/etc/h/secrets", "readOnly": True}],
        }],
        "volumes": [{"name": "config", "configMap": {"name": "cm"}}, {"name": "data", "emptyDir": {}},
                    {"name": "token", "secret": {"secretName": "s", "defaultMode": 288}}],
    }}},
}
OBJECTS = [{"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"h.yml": "global: {}\n"}}]


def pod(tmp_path, workload=WORKLOAD) -> PodmanPod:
    return PodmanPod(workload, OBJECTS, tmp_path, {"s": {"token": "t\n"}}, pod_name="pod-1")


def test_flags_follow_the_pod_spec(tmp_path):
    args = pod(tmp_path).run_args()
    image_at = args.index("localhost/headroom:dev")
    flags, container_args = args[:image_at], args[image_at + 1:]
    assert container_args == ["run", "--web.listen-address=:9999"]
    # the container's runAsUser wins over the pod's; the pod's group and fsGroup stay
    assert "--user=1000:65532" in flags and "--group-add=65532" in flags
    assert {"--read-only", "--read-only-tmpfs=false", "--security-opt=no-new-privileges", "--cap-drop=ALL",
            "--env=A=1", "--env=POD_NAME=pod-1", f"--memory={2**30}", "--stop-timeout=20"} <= set(flags)
    assert f"--volume={tmp_path}/config/h.yml:/etc/h/h.yml:ro" in flags
    assert f"--volume={tmp_path}/data:/var/lib/h:rw" in flags
    assert pod(tmp_path).probe_url("readinessProbe") == "http://127.0.0.1:9999/-/ready"


def test_volumes_are_written_as_the_kubelet_writes_them(tmp_path):
    pod(tmp_path).run_args()
    assert (tmp_path / "config" / "h.yml").read_text() == "global: {}\n"
    secret = (tmp_path / "token" / "token").stat()
    assert stat.S_IMODE(secret.st_mode) == 0o440
    if os.geteuid() == 0:  # only root can give the file to the fsGroup
        assert secret.st_gid == 65532 and (tmp_path / "data").stat().st_gid == 65532


@pytest.mark.parametrize("where, field", [("pod", "hostNetwork"), ("container", "lifecycle"),
                                          ("container", "envFrom")])
def test_a_field_it_does_not_translate_fails_loudly(tmp_path, where, field):
    workload = copy.deepcopy(WORKLOAD)
    spec = workload["spec"]["template"]["spec"]
    (spec if where == "pod" else spec["containers"][0])[field] = {}
    with pytest.raises(Untranslated, match=field):
        pod(tmp_path, workload)


def test_an_unknown_env_source_fails_loudly(tmp_path):
    workload = copy.deepcopy(WORKLOAD)
    workload["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
    with pytest.raises(Untranslated, match="env B"):
        pod(tmp_path, workload).run_args()
