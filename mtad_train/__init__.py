"""Training: the drafts and heads the decoding engine runs, and how they are made.

This package stands above :mod:`mtad`: it imports the engine (models, warping, the feature
head), the tasks (evaluation prompts, kept disjoint from the training text) and the harness's
environment record, and nothing under ``mtad/`` imports it, so the inference core can be read
without it. Its command lines are ``scripts/distill_draft.py`` (an independent draft, by online
distillation: :mod:`~mtad_train.loop`) and ``scripts/train_head.py`` (a feature-level head:
:mod:`~mtad_train.features`, :mod:`~mtad_train.head_train`, :mod:`~mtad_train.cumulative`);
their options are the fields of the dataclasses in :mod:`~mtad_train.config`, read once there.
"""
