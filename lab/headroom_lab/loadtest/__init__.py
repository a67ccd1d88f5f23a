"""`headroom loadtest` and `headroom compare`: closed-loop agent-task load tests against an
OpenAI-compatible endpoint, with the target's own metrics read beside the client's (docs/loadtest.md)."""
