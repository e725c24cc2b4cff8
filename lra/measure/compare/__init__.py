"""The harness's classifier next to a plain PyTorch twin: same weights, same logits, train
steps timed side by side (``scripts/compare_pytorch.py``, ``scripts/dense_floor.py``).

Behind the ``compare`` extra (PyTorch is never a dependency of the harness): without it,
importing this package fails with one line naming the extra. Modules, one seam each:

* :mod:`~lra.measure.compare.layers`, :mod:`~lra.measure.compare.attention`,
  :mod:`~lra.measure.compare.classifier`: the twin, mirroring ``models/`` (what a competent
  researcher would write in eager PyTorch, dropout placement included);
* :mod:`~lra.measure.compare.weights`: config -> harness model and twin, weight copy, the
  logits check;
* :mod:`~lra.measure.compare.timing`: round-robin timing cells;
* :mod:`~lra.measure.compare.table`, :mod:`~lra.measure.compare.run`: the table and the
  compare program's body; :mod:`~lra.measure.compare.floor`: the dense-floor program's.

The command lines themselves are parsed in :mod:`lra.measure.compare_cli` (no PyTorch needed).
"""

from lra.measure.compare_cli import INSTALL_HINT

try:
    import torch  # noqa: F401
except ImportError as _err:
    raise ImportError(
        f"lra.measure.compare needs PyTorch, which the harness does not install: {INSTALL_HINT} "
        f"({type(_err).__name__}: {_err})",
        name="torch",
    ) from None
