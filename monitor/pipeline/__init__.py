"""The collection cycle and the forecast refits as they run: `Pipeline` (cycle.py: collect -> step ->
publish, owning the sources and the state between cycles) and `ForecastScheduler` (forecaster.py: the
refit job and its latest result). The application (monitor/app) builds both and wires them together."""
