"""Softmax attention's plain and chunked paths side by side: train steps/s and compiled memory.

Builds the Figure-1 Transformer (Text setting, batch 2;
:func:`lra.measure.bench_config.compose_bench_config`) once per path and length, compiles
each train step ahead of time, then times them alternately in one process (``--rounds``
rounds of ``--steps`` steps per path), so a change in the machine's load falls on both paths
alike. Prints a markdown table:
steps/s min / median / max over the rounds, and XLA's compiled memory of the train step.

    python scripts/softmax_paths.py --lengths 1024,2048,4096 --dropouts 0.1,0 --rounds 4
    python scripts/softmax_paths.py --lengths 2048 --blocks 64,128,256   # chunked block sizes

The harness's CPU memory-analysis compiler flag is set as ``lra-bench`` sets it.
"""

import argparse
import time

from lra.device import measure

measure.configure_cpu_memory_analysis()

import jax  # noqa: E402

from lra.measure.bench import synthetic_batch  # noqa: E402
from lra.measure.bench_config import compose_bench_config  # noqa: E402
from lra.train.compile import abstract_batch, compile_steps  # noqa: E402

OPTION = "+model.attention_options.softmax"


def paths(blocks: list[int]) -> dict[str, list[str]]:
    """Path label -> config overrides."""
    out = {"plain": [f"{OPTION}.implementation=plain"]}
    for block in blocks:
        out[f"chunked (block {block})"] = [
            f"{OPTION}.implementation=chunked",
            f"{OPTION}.block_size={block}",
        ]
    return out


def time_paths(length: int, dropout: float, blocks: list[int], rounds: int, steps: int):
    runs = {}
    for label, overrides in paths(blocks).items():
        cfg = compose_bench_config("transformer", length, 2, overrides, attention_dropout=dropout)
        compiled = compile_steps(cfg, abstract_batch(cfg.task, 2), evaluate=False)
        batch = jax.device_put(synthetic_batch(cfg.task, 2, length))
        state, _ = compiled.train_step(compiled.state, batch, compiled.dropout_key)
        jax.block_until_ready(state)  # the warm-up step
        runs[label] = {
            "compiled": compiled,
            "state": state,
            "batch": batch,
            "rates": [],
            "memory": measure.compiled_memory_bytes(compiled.train_step),
        }
    for _ in range(rounds):
        for run in runs.values():
            compiled, state = run["compiled"], run["state"]
            start = time.perf_counter()
            for _ in range(steps):
                state, _ = compiled.train_step(state, run["batch"], compiled.dropout_key)
            jax.block_until_ready(state)
            run["rates"].append(steps / (time.perf_counter() - start))
            run["state"] = state
    rows = []
    for label, run in runs.items():
        rates = sorted(run["rates"])
        rows.append(
            f"| {length} | {dropout:g} | {label} | {rates[0]:.3g} / {rates[len(rates) // 2]:.3g}"
            f" / {rates[-1]:.3g} | {run['memory'] / 2**20:.0f} MiB |"
        )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--dropouts", default="0.1,0", help="attention dropout rates")
    parser.add_argument("--blocks", default="128", help="block sizes of the chunked path")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1, help="timed steps per round and path")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    dropouts = [float(x) for x in args.dropouts.split(",")]
    blocks = [int(x) for x in args.blocks.split(",")]
    print(f"{measure.environment()}; {args.rounds} rounds of {args.steps} step(s), batch 2")
    print("| length | attention dropout | path | train steps/s min / median / max | memory |")
    print("|---:|---:|---|---|---:|")
    for length in lengths:
        for dropout in dropouts:
            for row in time_paths(length, dropout, blocks, args.rounds, args.steps):
                print(row, flush=True)


if __name__ == "__main__":
    main()
