"""`headroom sim` end to end: prints its URLs, serves them, stops after --duration."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, timeout=40):
    return subprocess.Popen([sys.executable, "-m", "monitor.cli", "sim", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sim_prints_urls_serves_and_stops():
    p = run_cli("--scenario", "burst", "--duration", "4", "--status-every", "1", "--warmup", "5")
    try:
        header = []
        for line in p.stdout:
            header.append(line)
            if line.startswith("}"):
                break
        info = json.loads("".join(header))
        assert info["scenario"] == "burst"
        assert len(info["replicas"]["chat-8b"]) == 4
        urls = info["replicas"]["chat-8b"] + info["replicas"]["agent-70b"] + [
            info["gateway"], info["app"], info["dcgm"]]
        for url in urls:
            assert requests.get(url, timeout=5).status_code == 200
        assert info["theoretical_knee"]["chat-8b"] > 0
        rest, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        status = [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
        assert status and "chat-8b" in status[-1]["pools"]
        # stopped: ports closed
        try:
            requests.get(urls[0], timeout=2)
            raise AssertionError("still serving after --duration")
        except requests.ConnectionError:
            pass
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sim_legacy_names_flag():
    p = run_cli("--duration", "3", "--legacy-names", "--warmup", "0", "--status-every", "0")
    try:
        header = []
        for line in p.stdout:
            header.append(line)
            if line.startswith("}"):
                break
        info = json.loads("".join(header))
        text = requests.get(info["replicas"]["agent-70b"][0], timeout=5).text
        assert "vllm:gpu_cache_usage_perc{" in text and 'engine="' not in text
        p.communicate(timeout=30)
        assert p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sim_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  p:\n    max_num_seqs: -3\n")
    p = run_cli("--config", str(bad), "--duration", "1")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2
    assert "max_num_seqs must be >= 1" in err and "'p'" in err
    p = run_cli("--config", str(tmp_path / "missing.yaml"), "--duration", "1")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "not found" in err
