"""headroom-lab: the simulated fleet, the load tester and the demo, shipped apart from the daemon.

Sits on top of `monitor` (it imports monitor; monitor never imports it). The `headroom` command finds
this distribution's subcommands through the `headroom.commands` entry-point group and the digest's
demo input through `headroom.digest_demo` (lab/pyproject.toml).

    sim/            the simulated vLLM fleet, gateway, application and DCGM endpoints; history
    loadtest/       closed-loop agent-task load tests (`headroom loadtest`, `headroom compare`)
    commands/       `headroom demo`, `sim`, `loadtest`, `compare`
    digest_demo.py  a simulated fortnight as digest input (`headroom digest --demo`)
"""
