"""The generic kit: knows nothing of LLM fleets or of headroom's sections; every floor above may use it.

    settings/     declare a file's keys on dataclasses and read YAML against them (ConfigError)
    exposition    the Prometheus text / OpenMetrics parser (exposition_tokens, openmetrics_rules)
    http          the HTTP client: one deadline per request, bodies within a memory budget
    web/          the web server: HTTP/1.1, TLS and basic auth (webconfig), a priority lane
    ticker        jobs on the monotonic clock, and one on the wall clock looked at every 30 s
    timebox       a function run in a worker process with a time limit (fork server, never fork)
    process       the process's own lifecycle (stop a child, exit if stuck)
"""
