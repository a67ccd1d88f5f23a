"""`python -m monitor.config > docs/configuration.md`: the configuration reference, from the declarations."""
import sys

from .docs import render

sys.stdout.write(render())
