"""Real-engine test harness: a tiny dummy-weight model, vLLM / LiteLLM launchers and a load driver.

Used through the fixtures in tests/conftest.py (`vllm_small_engine`, `vllm_priority_engine`,
`vllm_engine_factory`, `litellm_gateway`; `engine.alerting` for a daemon and Prometheus on the
demo-scale rules) and directly:

    from engine.load import run_batch, ClosedLoop      # the load driver
    from engine.reference import engine_gauges          # independent parse of a vLLM scrape
"""
