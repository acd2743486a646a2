"""From runs to the paper: recipes (``experiments/``), their expansion into harness runs, the
rendered tables, figures and claims, and their W&B analysis run and report.

``scripts/reproduce.py`` is the command; ``hydra_plugins/mtad_recipes`` lets Hydra launch a
recipe's runs (``python run.py +experiment=llama70b``) through any Hydra launcher.
"""
