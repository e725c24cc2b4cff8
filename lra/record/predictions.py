"""Per-example predictions: ``predictions/<split>.npz`` in a run folder.

A classification run writes the predictions of its selected model on the test and validation
splits (:mod:`lra.train.loop`, and ``lra-eval`` the same), so the report can put intervals
and paired tests on its numbers (:mod:`lra.report.stats`; Bouthillier et al., MLSys 2021:
the finite test set is a source of variance as the seed is). One file per split holds, one
row per example evaluated (a Retrieval pair is one row):

- ``index``: ``int32[N]``, the example's position in the prepared split;
- ``label``: ``int32[N]``, its label;
- ``pred``: ``int32[N]``, the class the eval step's argmax chose (the one its correct count
  uses, so the accuracy from the file equals the record's to the last bit);
- ``logits``: ``float16[N, C]``.

The file is an ordinary ``.npz`` (``numpy.load`` reads it), written compressed, with a fixed
date in every member, so the same predictions give the same bytes and the same SHA-256 (a
resumed run's files equal an uninterrupted run's); and atomically, so a reader sees all of
it or none. NumPy only: the report reads these files without JAX.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

from lra.atomic import atomic_file
from lra.errors import DataError

FOLDER = "predictions"
FIELDS = {"index": np.int32, "label": np.int32, "pred": np.int32, "logits": np.float16}
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip member can carry


def relative_path(split: str) -> str:
    """Where a run's predictions on ``split`` live, relative to its folder."""
    return f"{FOLDER}/{split}.npz"


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checked(rows: dict) -> dict:
    missing = [k for k in FIELDS if k not in rows]
    if missing:
        raise ValueError(f"predictions lack {', '.join(missing)}")
    arrays = {k: np.asarray(rows[k]).astype(dtype) for k, dtype in FIELDS.items()}
    n = len(arrays["index"])
    if any(len(a) != n for a in arrays.values()) or arrays["logits"].ndim != 2:
        shapes = {k: a.shape for k, a in arrays.items()}
        raise ValueError(f"predictions need N rows in every field and logits [N, C]: {shapes}")
    return arrays


def write(path: str | Path, rows: dict) -> dict:
    """Write ``rows`` (the fields above) to ``path``; returns what a record names of it:
    ``{"file", "sha256", "examples", "accuracy"}`` (``file`` as given)."""
    arrays = _checked(rows)
    with atomic_file(path) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, array in arrays.items():
                member = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_DATE)
                member.compress_type = zipfile.ZIP_DEFLATED
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
                archive.writestr(member, buffer.getvalue())
        digest = sha256(tmp)
    return {
        "file": str(path),
        "sha256": digest,
        "examples": int(len(arrays["index"])),
        "accuracy": accuracy(arrays),
    }


def read(path: str | Path, expected_sha256: str | None = None) -> dict:
    """The arrays of a predictions file; with ``expected_sha256`` (the record's) a file that
    changed since the record was written is refused."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no predictions file {path}; rerun lra-eval on the run to write it")
    if expected_sha256 is not None and (found := sha256(path)) != expected_sha256:
        raise DataError(
            f"{path} has SHA-256 {found[:12]}..., not the {expected_sha256[:12]}... its record "
            "names: it was changed after the run; write it again with lra-eval"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            return _checked({k: data[k] for k in data.files})
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise DataError(f"cannot read predictions {path} ({err})") from None


def accuracy(rows: dict) -> float:
    """The fraction of rows whose ``pred`` equals its ``label``."""
    return float(np.mean(np.asarray(rows["pred"]) == np.asarray(rows["label"])))
