"""The cycle's pure step: what it reads and keeps (cycle_state.py) and `step` itself (cycle_step.py):
no I/O, no clock, the same state, inputs and `now` give the same snapshot."""
