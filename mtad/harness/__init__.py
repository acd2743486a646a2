"""The experiment harness around the engine: Hydra configs, runs, result folders, logging.

``run.py`` (Hydra) -> :func:`mtad.harness.job.run`: validate and prepare (:mod:`.config`,
:mod:`.preflight`, :mod:`.prepare`), skip complete runs (their identity: :mod:`mtad.runs`),
lease the result folder (:mod:`.lease`), load and generate (:mod:`.generation`) under
codecarbon (:mod:`.energy`), score, write ``results/<study>/<signature>/`` (:mod:`.records`)
and one W&B run (:mod:`.wandb_logger`), print a summary (:mod:`.summary`, over
:mod:`mtad.runs`); sweeps end with :class:`.callbacks.SweepSummary`.
"""
