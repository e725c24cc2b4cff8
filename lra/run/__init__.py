"""One run's life on disk: its identity and folder, checkpoints, signals and lock.

A run folder, ``<results_dir>/<model>-<task>-s<seed>-<hash>/``, holds everything of
one training run: ``config.json`` (the resolved config), ``checkpoints/`` (orbax),
``lock`` and, once finished, ``record.json``. Rerunning the same command finds the
same folder, so resume, skip-done and ``lra-eval`` all start from here.
"""
