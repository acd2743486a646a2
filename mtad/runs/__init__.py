"""What a run is and how runs are read and compared: below both the harness and the paper.

- :mod:`.folder`: the result folder's format, written (by the harness) and read;
- :mod:`.hardware`: the hardware rule (which facts of a machine decide timing);
- :mod:`.identity`: the one run identity, from which the folder signature, the comparison key
  and the paper's keys derive;
- :mod:`.labels`: the run label of every table;
- :mod:`.frame`: runs as one pandas frame; :mod:`.comparison`: the one comparison rule and the
  paired runs; :mod:`.intervals`: their confidence intervals and a verdict's rule;
  :mod:`.claims`: a claim decided on runs (the paper's claims, the comparison sweep's);
  :mod:`.tables`: a study's quick tables, the sweep summary and the comparison sweep's table.

Imports only the standard library, numpy, pandas, scipy and PyYAML: never torch, Hydra, the
harness or the paper (``analysis/`` reads results through this package alone, and
``tests/test_torch_free.py`` checks it).
"""
