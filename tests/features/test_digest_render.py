"""`headroom digest --demo --out DIR` end to end, and the HTML page rendered by real headless Chromium."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PY):
    PY = sys.executable
CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.live  # tests/tiers.py: this file starts servers or binaries


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("digest")
    r = subprocess.run([PY, "-m", "monitor", "digest", "--demo", "--out", str(out),
                        "--week-end", "2025-12-01"], cwd=ROOT, capture_output=True, timeout=900)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    summary = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert summary["week"] == "2025-W48"
    return out


def test_cli_writes_every_format(out_dir):
    names = sorted(os.listdir(out_dir))
    assert names == ["digest.html", "digest.json", "digest.md", "pool0-forecast.png",
                     "pool0-headroom.png", "pool1-forecast.png", "pool1-headroom.png"]
    md = (out_dir / "digest.md").read_text()
    assert "![forecast of pool agent-70b](pool0-forecast.png)" in md
    d = json.loads((out_dir / "digest.json").read_text())
    assert [p["name"] for p in d["pools"]] == ["agent-70b", "chat-8b"]


def test_html_is_self_contained(out_dir):
    html = (out_dir / "digest.html").read_text()
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) == 4 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert "<script" not in html


def test_cli_rejects_bad_input(tmp_path):
    r = subprocess.run([PY, "-m", "monitor", "digest", "--demo", "--out", str(tmp_path),
                        "--week-end", "next tuesday"], cwd=ROOT, capture_output=True, timeout=120)
    assert r.returncode == 2 and b"--week-end" in r.stderr
    r = subprocess.run([PY, "-m", "monitor", "digest", "--demo", "--out", str(tmp_path), "--days", "5"],
                       cwd=ROOT, capture_output=True, timeout=120)
    assert r.returncode == 2 and b"more than a week" in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sources: {prometheus: {url: 'http://127.0.0.1:9'}}\ndigest: {schedule: {hour: 25}}\n")
    r = subprocess.run([PY, "-m", "monitor", "digest", "--config.file", str(cfg)], cwd=ROOT,
                       capture_output=True, timeout=120)
    assert r.returncode == 2 and b"digest.schedule.hour" in r.stderr


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs headless Chromium at /usr/bin/chromium")
def test_html_renders_in_headless_chromium(out_dir, tmp_path):
    import matplotlib.image as mpimg
    png = tmp_path / "out.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-quic", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           "--hide-scrollbars", "--window-size=1200,1600", f"--screenshot={png}",
           f"file://{out_dir / 'digest.html'}"]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    assert r.returncode == 0 and png.exists(), r.stderr.decode()[-2000:]
    img = mpimg.imread(str(png))
    assert img.shape[0] == 1600 and img.shape[1] == 1200
    rgb = (img[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    colours = np.unique(rgb, axis=0)
    assert len(colours) > 500  # charts, bands and text, not a blank or single-colour page
    # the page background is the most common colour, but far from everything
    _, counts = np.unique(rgb, axis=0, return_counts=True)
    assert counts.max() / len(rgb) < 0.8
    # some dark pixels (text, the actual line) and some blue (the forecast band / headroom line)
    assert (rgb.sum(axis=1) < 150).mean() > 0.002
    blue = (rgb[:, 2].astype(int) - rgb[:, 0].astype(int) > 60)
    assert blue.mean() > 0.001
