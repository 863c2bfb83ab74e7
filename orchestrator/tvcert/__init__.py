"""tvcert: certified verification of distributed LLM training plans."""
__version__ = "0.1.0"
