"""headroom: live capacity monitor for LLM inference fleets."""
__version__ = "0.1.0"
