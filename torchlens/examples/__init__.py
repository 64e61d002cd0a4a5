"""Runnable examples: ``python -m torchlens.examples.demo``."""
