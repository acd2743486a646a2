"""The experiment harness around the engine: Hydra configs, runs, result folders, logging.

``run.py`` (Hydra) -> :func:`mtad.harness.runner.run`: validate (:mod:`.config`), skip complete
runs (:mod:`.signature`, :mod:`.results`), load, generate under codecarbon (:mod:`.energy`),
score, write ``results/<study>/<signature>/`` and one W&B run (:mod:`.wandb_logger`), print a
summary (:mod:`.summary`, :mod:`.tables`); sweeps end with :class:`.callbacks.SweepSummary`.
"""
