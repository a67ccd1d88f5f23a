"""Simulator speed: simulated seconds per CPU second for the busy default fleet (see lab/headroom_lab/sim/bench.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from headroom_lab.sim.bench import main  # noqa: F401
