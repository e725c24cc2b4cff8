"""Train every model for the default job's budget on listops_tiny; tabulate the accuracies.

Prepares listops_tiny (a no-op when it is ready), then runs one Hydra multirun of lra-train
over every configs/model/*.yaml on task=listops_tiny (the default job's data, model size and
2000 steps), writing records to --records, then prints a table: test accuracy (best-validation
checkpoint), the majority-class rate, train steps/sec and parameter count. These are
tiny-task CPU numbers, not LRA scores.

    python scripts/listops_tiny_every_model.py [--records DIR] [--models a,b,...]

``--models`` runs only the named models (to finish an interrupted sweep); the table is always
built from every record in ``--records``.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model"


def table(records: list[dict]) -> str:
    lines = [
        "| model | test accuracy | val accuracy | majority class | train steps/s | params |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(records, key=lambda r: -r["test_accuracy"]):
        lines.append(
            f"| {r['model']} | {r['test_accuracy']:.4f} | {r['val_accuracy']:.4f} | "
            f"{r['test_majority_rate']:.4f} | {r['train_steps_per_sec']:.1f} | "
            f"{r['num_params']:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="results/cpu-tiny/listops_tiny_models")
    parser.add_argument("--models", default=None, help="comma-separated model names")
    parser.add_argument("overrides", nargs="*", help="extra lra-train overrides")
    args = parser.parse_args()
    models = args.models or ",".join(sorted(p.stem for p in CONFIGS.glob("*.yaml")))
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "lra-data"), "task=listops_tiny"], check=True)  # no-op if ready
    command = [
        str(bin_dir / "lra-train"),
        "-m",
        f"model={models}",
        "task=listops_tiny",
        f"results_dir={args.records}",
        "trainer.progress=false",
        *args.overrides,
    ]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    records = [json.loads(p.read_text()) for p in Path(args.records).glob("*/record.json")]
    text = table(records)
    Path(args.records, "README.md").write_text(
        "listops_tiny, every model, the default job's budget (2000 steps), seed 0, CPU.\n"
        "Tiny-task CPU numbers: a check that each model learns, not LRA scores.\n\n" + text
    )
    print(text)


if __name__ == "__main__":
    main()
