"""The subcommands headroom-lab adds to `headroom`, each `(module, one-line help)`.

The entry points of the `headroom.commands` group name these tuples, so `headroom --help` reads the
help lines from this small module without importing any command (monitor/commands/cli.py).
"""
DEMO = ("headroom_lab.commands.demo", "start a simulated fleet, headroom and (if installed) Prometheus")
SIM = ("headroom_lab.commands.sim", "run the simulated vLLM fleet on its own")
LOADTEST = ("headroom_lab.commands.loadtest",
            "closed-loop agent-task load test against an OpenAI-compatible endpoint")
COMPARE = ("headroom_lab.commands.compare", "compare two load-test results side by side")
