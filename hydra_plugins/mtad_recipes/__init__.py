"""Hydra sweeper that launches the runs of ``experiments/`` recipes (see mtad.paper)."""
