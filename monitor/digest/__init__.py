"""The weekly forecast digest (issue 7): content, rendering, delivery through a persisted outbox.

    settings.py   the `digest:` configuration section (schedule, destinations, prices, SLO targets)
    content.py    pure: a week of history + capacity -> the digest dict (peaks, SLO, forecast, cost,
                  recommendations)
    forecasts.py  pure: next week's forecast, how last week's did, the recommendation
    coverage.py   pure: the hours history covers, whole task counts, the cost over those hours
    knee_report.py  the knee headroom learned (Prometheus series, the daemon's snapshot), else a prior
    (the simulated fortnight of `headroom digest --demo` is headroom-lab's: lab/headroom_lab/digest_demo.py)
    sources.py    history from the HistoryStore or Prometheus as digest input (a shard's pools)
    charts.py     matplotlib PNGs (actual vs forecast with bands, headroom over the week)
    render.py     Markdown, self-contained HTML, JSON and the Slack-compatible summary
    outbox.py     SQLite (WAL) outbox: one row per (edition: ISO week and shard, destination), retried
    deliver.py    directory, webhook and SMTP destinations
    schedule.py   schedule_digest(scheduler, settings, build_fn) for the daemon; run_digest
    metrics.py    (name, labels, value) triples for the catalogue's digest metrics
    cli.py        `headroom digest`
"""
