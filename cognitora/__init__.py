"""Cognitora: the decision core (placement, config, CLI) and the simulated fleet. No gateway imports here."""
