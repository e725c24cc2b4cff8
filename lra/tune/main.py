"""``lra-tune``: equal tuning budgets, on the validation split only (issue 39).

``lra-tune <lra-train's overrides> tune.n_trials=16 ...`` composes ``configs/tune.yaml``
(lra-train's config and the ``tune`` group, ``configs/tune/default.yaml``), checks everything
that can be wrong before any trial starts (the search space against the schema,
:mod:`lra.tune.search`; the storage opens, :mod:`lra.tune.study`; a budget of 0 is the schema's
error), then:

1. searches (:mod:`lra.tune.worker`): Optuna's ask-and-tell interface, one trial at a time, each
   an ordinary validation-only run in its own run folder, until the study's ``tune.n_trials``
   trials are spent, whatever number of workers share it; the console shows the trials done out
   of the budget and the best so far;
2. trains the best trial's values with ``tune.final_seeds`` seeds (:mod:`lra.tune.final`),
   ordinary runs that test, each record with its ``tuning`` block;
3. writes ``<results_dir>/tune/<study>.study.json`` (:mod:`lra.tune.summary`) and prints the
   result. Rerunning a finished study trains nothing and prints it again.

``lra-tune -m hydra/launcher=slurm tune.worker='range(K)'`` starts K workers of one study as
SLURM jobs (the launcher of ``lra-train -m``); ``-m model=a,b`` tunes one study per model.
"""

import copy
import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from lra.config import schema
from lra.config.compose import CONFIG_DIR
from lra.errors import ConfigError
from lra.run import sweep
from lra.run.exit_status import report_errors

log = logging.getLogger("lra.tune")


def train_config(cfg):
    """lra-train's config inside the tune app's ``cfg`` (without its ``tune`` block)."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        del out["tune"]
    return out


def context(cfg):
    """Everything a worker needs, checked: one line for what is wrong, before any trial."""
    from lra.train import pretrain
    from lra.tune import search, study, worker

    train_cfg = train_config(cfg)
    schema.validate(train_cfg, "config")
    if pretrain.is_two_stage(train_cfg):
        raise ConfigError(
            "lra-tune tunes single-stage runs; drop pretrain= (tune the fine-tuning stage's "
            "settings with a search file of your own and pretrain=none)"
        )
    if cfg.trainer.get("evaluate_test", True) is False:
        raise ConfigError("trainer.evaluate_test=false: lra-tune sets it for its trials itself")
    space = search.load_space(cfg.tune.search, train_cfg)
    if cfg.tune.sampler == "grid" and int(cfg.tune.n_trials) > search.grid_size(space):
        raise ConfigError(
            f"tune.n_trials={cfg.tune.n_trials} exceeds the grid's {search.grid_size(space)} "
            "points; lower the budget or add grid points"
        )
    base = OmegaConf.to_container(train_cfg, resolve=True)
    name = study.study_name(cfg, base, space, search.space_hash(space))
    spec = study.storage_spec(cfg, name)
    loaded = study.load(cfg, study.open_storage(spec), name, space, base)
    claims = study.tune_dir(cfg) / f"{name}.claims"
    return worker.Context(cfg, train_cfg, base, space, name, spec, claims, loaded)


def dashboard_command(spec: str) -> str:
    return f"optuna-dashboard {spec if '://' in spec else repr(spec)[1:-1]}"


def summarize(result: dict) -> str:
    """The lines ``lra-tune`` prints at the end."""
    lines = [
        f"study {result['study']}: {result['model']} on {result['task']} "
        f"(protocol {result['protocol']})",
        f"  trials      {result['completed']} completed, {result['pruned']} pruned, "
        f"{result['failed']} failed of {result['settings']['n_trials']}",
    ]
    if result["best"]:
        chosen = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in result["best"]["params"].items()
        )
        lines.append(
            f"  best        trial {result['best']['trial']}: val {result['best']['value']:.4f} "
            f"with {chosen}"
        )
    for final in result["finals"]:
        lines.append(
            f"  final s{final['seed']}    val {final['val_accuracy']:.4f}  "
            f"test {final['test_accuracy']:.4f}  ({final['run_key']})"
        )
    lines.append(f"  study file  {result['path']}")
    lines.append(f"  watch it    {dashboard_command(result['storage'])}")
    return "\n".join(lines)


def tune(cfg) -> dict:
    """Search, train the finals, write the study file; the summary (with ``path``)."""
    from lra.tune import final, summary, worker

    ctx = context(cfg)
    study = ctx.study
    log.info(
        f"study {ctx.name} ({ctx.storage_spec}): {worker.progress_line(study, ctx.n_trials)}; "
        f"watch it with {dashboard_command(ctx.storage_spec)}"
    )
    worker.search(ctx)
    finals = []
    if int(cfg.tune.final_seeds) and final.studies.best(study) is None:
        raise ConfigError(
            f"study {ctx.name}: no trial completed ({worker.progress_line(study, ctx.n_trials)}), "
            "so there is nothing to train with final seeds; see the trials' errors in "
            f"{summary.summary_path(ctx)}"
        )
    if int(cfg.tune.final_seeds):
        finals = final.run_finals(ctx, study)
    path, result = summary.write_summary(ctx, study, finals)
    return {**result, "path": str(path)}


def _job(cfg) -> dict:
    """One sweep job's result as the row of ``lra.run.sweep`` reads it."""
    schema.validate(cfg, "tune")
    result = tune(cfg)
    tests = [f["test_accuracy"] for f in result["finals"]]
    return {
        **result,
        "test_accuracy": sum(tests) / len(tests) if tests else None,
        "record_path": result["path"],
    }


def _tune(cfg):
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return sweep.run_job(cfg, _job, summarize)
    schema.validate(cfg, "tune")
    result = tune(cfg)
    log.info(summarize(result))
    return result["best"]["value"] if result["best"] else None


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="tune")
def _tune_app(cfg):
    return report_errors(_tune, cfg)


def tune_main():
    """``lra-tune``: tune one model on one task (or, with ``-m``, a sweep of studies or workers)."""
    from lra.device import measure

    schema.check_command_line("tune")
    measure.configure_cpu_memory_analysis()
    _tune_app()
    if sweep.failed_jobs:
        raise SystemExit(1)
