"""Pathfinder / Path-X generation rate and disk use, extrapolated to the official 200,000 images.

Generates ``--images`` images per setting with ``write_pathfinder`` (one worker, so the
CPU seconds per image are the single-core cost), measures CPU time, wall time and bytes
allocated on disk (whole file-system blocks: a 0.5 KiB PNG still takes a block), and
extrapolates to ``--total`` images on ``--cores`` cores.

    python scripts/measure_pathfinder_generation.py [--images 300] [--total 200000] [--cores 2]
"""

import argparse
import resource
import tempfile
import time
from pathlib import Path

from lra.data.pathfinder_gen import write_pathfinder

SETTINGS = [(32, "curv_contour_length_14"), (128, "curv_contour_length_14")]


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--total", type=int, default=200_000)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    print(
        f"| setting | CPU s/image | wall s/image (1 worker) | disk KiB/image | "
        f"{args.total:,} images: CPU hours | hours on {args.cores} cores | GiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for resolution, difficulty in SETTINGS:
        with tempfile.TemporaryDirectory() as tmp:
            cpu0, wall0 = cpu_seconds(), time.perf_counter()
            folder = write_pathfinder(
                Path(tmp),
                resolution,
                difficulty,
                args.images,
                seed=0,
                images_per_batch=100,
                num_workers=1,
                progress=False,
            )
            cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
            files = [p for p in folder.rglob("*") if p.is_file()]
            size = sum(p.stat().st_blocks * 512 for p in files)  # allocated, not apparent
        per_cpu, per_wall, per_bytes = cpu / args.images, wall / args.images, size / args.images
        print(
            f"| pathfinder{resolution} {difficulty} | {per_cpu:.3f} | {per_wall:.3f} | "
            f"{per_bytes / 1024:.2f} | {per_cpu * args.total / 3600:.1f} | "
            f"{per_cpu * args.total / 3600 / args.cores:.1f} | "
            f"{per_bytes * args.total / 2**30:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
