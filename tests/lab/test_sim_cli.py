"""`headroom sim` end to end: prints its URLs, serves them, stops after --duration."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


def run_cli(*args, timeout=40):
    return subprocess.Popen([sys.executable, "-m", "monitor", "sim", *args], cwd=ROOT,
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


def parse_args(*argv):
    import argparse

    from headroom_lab.commands import sim as cli
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return cli, p.parse_args(list(argv))


def test_sim_legacy_names_flag_in_process():
    import contextlib
    import io
    import threading
    import time

    cli, args = parse_args("--duration", "3", "--legacy-names", "--warmup", "0",
                           "--status-every", "0")
    out = io.StringIO()
    rc = []

    def target():
        with contextlib.redirect_stdout(out):
            rc.append(cli.run(args))

    th = threading.Thread(target=target)
    th.start()
    try:
        deadline = time.time() + 20
        while "\n}\n" not in out.getvalue() and time.time() < deadline:
            time.sleep(0.05)
        text = out.getvalue()
        info = json.loads(text[: text.index("\n}\n") + 3])
        page = requests.get(info["replicas"]["agent-70b"][0], timeout=5).text
        assert "vllm:gpu_cache_usage_perc{" in page and 'engine="' not in page
    finally:
        th.join(timeout=30)
    assert rc == [0]


def test_sim_bad_arguments_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  p:\n    max_num_seqs: -3\n")
    cli, args = parse_args("--config", str(bad), "--duration", "1")
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert "max_num_seqs must be >= 1" in err and "'p'" in err
    cli, args = parse_args("--config", str(tmp_path / "missing.yaml"), "--duration", "1")
    assert cli.run(args) == 2
    assert "not found" in capsys.readouterr().err
    cli, args = parse_args("--day-seconds", "60", "--duration", "1")
    assert cli.run(args) == 2
    assert "--day-seconds only applies to --scenario diurnal" in capsys.readouterr().err
    cli, args = parse_args("--duration", "-1")
    assert cli.run(args) == 2
