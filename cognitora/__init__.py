"""Cognitora: the decision core (placement, config, CLI) and the simulated fleet. No gateway imports here."""

__all__: list[str] = []
