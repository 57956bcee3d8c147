"""Estimators: memory (fit), compute and communication time (speed)."""
