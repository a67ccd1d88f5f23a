"""`python -m monitor ...` is `headroom ...` (monitor/commands/cli.py)."""
import sys

from monitor.commands.cli import main

sys.exit(main())
