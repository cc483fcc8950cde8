"""Optimizers, schedules, loss scaling and gradient accumulation live here."""
