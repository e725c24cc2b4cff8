"""Finding files of an extracted official ``lra_release`` archive (REFERENCE section 2).

The archive extracts to a nested ``lra_release/lra_release``; users may point
``data_dir`` at either level, or at a folder that holds ``lra_release``. Every
reader of official files asks :func:`find_release_path` instead of guessing.
"""

from __future__ import annotations

from pathlib import Path

RELEASE_NAME = "lra_release"


def release_candidates(data_dir: Path, relative: str | Path) -> list[Path]:
    """Where ``relative`` may sit under ``data_dir``: directly, or one or two
    ``lra_release`` levels down, in that order."""
    data_dir = Path(data_dir)
    return [
        data_dir / relative,
        data_dir / RELEASE_NAME / relative,
        data_dir / RELEASE_NAME / RELEASE_NAME / relative,
    ]


def find_release_path(data_dir: Path, relative: str | Path) -> Path | None:
    """The first existing candidate of :func:`release_candidates`, else None."""
    for candidate in release_candidates(data_dir, relative):
        if candidate.exists():
            return candidate
    return None
