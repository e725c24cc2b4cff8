"""Round-robin timing of the harness's compiled train step and the twin's eager one.

A :class:`Cell` is one (model, length, attention dropout): the compiled harness step with its
state and the twin with its AdamW, both on the same synthetic batch. Each timing reports
steps/sec and the cores other processes kept busy meanwhile (:mod:`lra.device.machine_load`).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from lra.measure.bench_config import compose_bench_config
from lra.measure.compare.table import cores
from lra.measure.compare.weights import build_harness, build_twin, torch_inputs, twin_kwargs


class Cell:
    """One (model, length, attention dropout): the compiled harness step and its state, and
    the twin with its optimizer, both on the same synthetic batch."""

    def __init__(self, model, length, batch_size, dropout, overrides, device):
        import jax

        from lra.measure.bench import synthetic_batch
        from lra.train.compile import abstract_batch, compile_steps
        from lra.train.optim import make_schedule

        self.model, self.length, self.attention_dropout = model, int(length), float(dropout)
        self.device = device
        cfg = compose_bench_config(model, length, batch_size, overrides, attention_dropout=dropout)
        twin_kwargs(cfg)  # refuse what the twin cannot mirror before compiling
        batch = synthetic_batch(cfg.task, batch_size, length)
        self.compiled = compile_steps(cfg, abstract_batch(cfg.task, batch_size), evaluate=False)
        self.flops_per_step = self.compiled.flops_per_step
        self.state = self.compiled.state
        self.batch = jax.device_put(batch)
        self.twin = build_twin(cfg, build_harness(cfg)).to(device).train()
        t = cfg.trainer
        peak = make_schedule(
            t.schedule, t.learning_rate, t.warmup_steps, t.num_steps, t.get("decay_steps")
        )(max(int(t.warmup_steps), 1))
        self.learning_rate = float(peak)
        self.grad_clip = float(t.grad_clip or 0.0)
        self.optimizer = torch.optim.AdamW(
            self.twin.parameters(),
            lr=self.learning_rate,
            betas=(float(t.b1), float(t.b2)),
            eps=float(t.eps),
            weight_decay=float(t.weight_decay),
        )
        self.inputs = torch_inputs(batch, device)
        self.labels = torch.as_tensor(batch["labels"], dtype=torch.long, device=device)
        self.weights = torch.as_tensor(batch["weights"], device=device)

    def harness_steps(self, n: int):
        metrics = None
        for _ in range(n):
            self.state, metrics = self.compiled.train_step(
                self.state, self.batch, self.compiled.dropout_key
            )
        return self.state, metrics

    def twin_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.twin(*self.inputs)
        losses = F.cross_entropy(logits, self.labels, reduction="none")
        loss = (losses * self.weights).sum() / self.weights.sum()
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.twin.parameters(), self.grad_clip)
        self.optimizer.step()
        return loss

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_harness(self, warmup: int, steps: int) -> tuple[float, float | None]:
        """(steps/sec, cores other processes kept busy meanwhile)."""
        import jax

        from lra.device.machine_load import LoadProbe

        jax.block_until_ready(self.harness_steps(warmup))
        probe = LoadProbe()
        probe.start()
        start = time.perf_counter()
        jax.block_until_ready(self.harness_steps(steps))
        rate = steps / (time.perf_counter() - start)
        return rate, probe.stop()["other_cores"]

    def time_twin(self, warmup: int, steps: int) -> tuple[float, float | None]:
        from lra.device.machine_load import LoadProbe

        for _ in range(warmup):
            self.twin_step()
        self._sync()
        probe = LoadProbe()
        probe.start()
        start = time.perf_counter()
        for _ in range(steps):
            self.twin_step()
        self._sync()
        rate = steps / (time.perf_counter() - start)
        return rate, probe.stop()["other_cores"]


def time_cells(models, lengths, dropouts, args, device) -> list[dict]:
    """Round-robin timing; returns one raw row per cell with per-round rates."""
    cells: dict[tuple, Cell] = {}
    rows: dict[tuple, dict] = {}
    for round_index in range(args.rounds):
        for length in lengths:
            for model in models:
                for dropout in dropouts:
                    key = (model, length, dropout)
                    if key not in cells:
                        cells[key] = Cell(
                            model, length, args.batch_size, dropout, args.overrides, device
                        )
                        rows[key] = {
                            "model": model,
                            "length": length,
                            "attention_dropout": dropout,
                            "batch_size": args.batch_size,
                            "flops_per_step": cells[key].flops_per_step,
                            "torch_learning_rate": cells[key].learning_rate,
                            "harness_steps_per_sec": [],
                            "torch_steps_per_sec": [],
                            "harness_other_cores": [],
                            "torch_other_cores": [],
                        }
                    cell, row = cells[key], rows[key]
                    harness, harness_load = cell.time_harness(args.warmup, args.steps)
                    twin, twin_load = cell.time_twin(args.warmup, args.steps)
                    row["harness_steps_per_sec"].append(harness)
                    row["torch_steps_per_sec"].append(twin)
                    row["harness_other_cores"].append(harness_load)
                    row["torch_other_cores"].append(twin_load)
                    print(
                        f"round {round_index + 1}/{args.rounds} {model} L={length} "
                        f"attention_dropout={dropout}: harness {harness:.3g} steps/s, "
                        f"PyTorch {twin:.3g} steps/s (other processes: "
                        f"{cores(harness_load)} / {cores(twin_load)} cores busy)",
                        flush=True,
                    )
    out = []
    for row in rows.values():
        row["ratio"] = [
            h / t
            for h, t in zip(row["harness_steps_per_sec"], row["torch_steps_per_sec"], strict=True)
        ]
        flops = row["flops_per_step"]
        row["harness_flops_per_sec"] = (
            None if flops is None else [flops * h for h in row["harness_steps_per_sec"]]
        )
        out.append(row)
    return out
