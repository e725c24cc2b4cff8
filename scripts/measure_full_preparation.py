"""Full-size Text and Image preparation time and disk use, without the internet.

Builds archives in the official layouts at the official sizes with synthetic content (an
aclImdb_v1.tar.gz with 25,000 + 25,000 reviews, a cifar-10-binary.tar.gz with 50,000 +
10,000 images) using ``lra.data.synthetic_archives``, then times ``text.prepare`` and
``image.prepare`` on them (one process) and reports the prepared size. The real archives
are larger (real reviews are longer), so decompression takes longer than measured here.

    python scripts/measure_full_preparation.py
"""

import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from lra.cli import CONFIG_DIR
from lra.data import image, store, text
from lra.data import synthetic_archives as synthetic


def task_config(task: str, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", [f"task={task}", *overrides])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        archives = {
            "text": synthetic.write_imdb_archive(tmp / "aclImdb_v1.tar.gz", num_per_class=12500),
            "image": synthetic.write_cifar_archive(
                tmp / "cifar-10-binary.tar.gz", num_per_batch=10000, num_test=10000
            ),
        }
        for task, module in [("text", text), ("image", image)]:
            archive = archives[task]
            cfg = task_config(
                task,
                f"task.source.archive={archive}",
                "task.source.sha256=null",
                "task.source.tfds=false",
            )
            start = time.perf_counter()
            folder = module.prepare(cfg.task, tmp / "data", 1)
            seconds = time.perf_counter() - start
            size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            print(
                f"{task}: archive {archive.stat().st_size / 2**20:.0f} MiB, prepare "
                f"{seconds:.1f} s, prepared {size / 2**20:.0f} MiB, "
                f"counts {store.read_meta(folder)['counts']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
