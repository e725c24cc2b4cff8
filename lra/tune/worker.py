"""One ``lra-tune`` worker: take trials of a study until its budget is spent.

A trial is an ordinary run (:func:`lra.train.loop.train_and_evaluate`) of the base config with
the trial's values (:func:`lra.tune.search.suggest`) and ``trainer.evaluate_test=false``: it
validates every ``trainer.eval_every`` steps, never opens the test split and writes a record of
kind ``trial`` in its own run folder (by identity, under ``results_dir``). Its value is the
record's ``val_accuracy``, the selected checkpoint's validation accuracy. A finished run folder
(the same values again, or a study started anew) is not trained again.

The worker first takes over any trial whose worker died (:func:`lra.tune.study.orphans`): the
trial's run folder resumes from its newest checkpoint and the trial is told its value as if
nothing happened. Pruning (``tune.pruner``) reports each validation accuracy to the trial and
ends a run that falls below the pruner's bar (``PRUNED``); a run that fails with an error of its
values (a diverging loss, running out of memory) is ``FAIL`` and spends its place in the budget.
A stop signal (after saving the run's checkpoint) and missing or damaged data (a
:class:`~lra.errors.DataError`, the same for every trial) stop the worker and leave the trial
``RUNNING`` for the next run of the command.
"""

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from lra.config.identity import run_dir
from lra.errors import DataError, LRAError
from lra.run.lock import RunLocked
from lra.run.signals import Interrupted
from lra.tune import study as studies
from lra.tune.search import Space, apply, suggest
from lra.tune.summary import write_summary

log = logging.getLogger("lra.tune")


@dataclass
class Context:
    """What every trial of one study shares."""

    cfg: object  # the tune app's config (train config + tune)
    train_cfg: object  # the base train config (no tune block)
    base: dict  # train_cfg resolved
    space: Space
    name: str  # the study's name
    storage_spec: str
    claims: Path
    study: object  # the optuna Study (lra.tune.study.load)

    @property
    def n_trials(self) -> int:
        return int(self.cfg.tune.n_trials)


def trial_config(ctx: Context, values: dict):
    """The train config of a trial: the base with ``values``, validation only."""
    return apply(ctx.train_cfg, {**values, "trainer.evaluate_test": False})


def progress_line(study, n_trials: int) -> str:
    c = studies.counts(study)
    done = c["completed"] + c["pruned"] + c["failed"]
    top = studies.best(study)
    best = f"best val {top.value:.4f} (trial {top.number})" if top else "no trial completed yet"
    return (
        f"{done}/{n_trials} trials done ({c['completed']} completed, {c['pruned']} pruned, "
        f"{c['failed']} failed, {c['running']} running); {best}"
    )


def _train_trial(ctx: Context, study, trial, values: dict) -> None:
    """Train one claimed trial and tell Optuna how it ended."""
    from lra.train.loop import train_and_evaluate

    optuna = studies.optuna()

    def on_validate(step: int, accuracy: float) -> None:
        trial.report(accuracy, step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} (val accuracy {accuracy:.4f})")

    number = trial.number
    try:
        record = train_and_evaluate(trial_config(ctx, values), on_validate=on_validate)
    except optuna.TrialPruned as err:
        study.tell(number, state=optuna.trial.TrialState.PRUNED)
        log.info(f"trial {number}: {err}")
        return
    except RunLocked as err:  # another worker trains these values (the same run folder)
        log.warning(f"trial {number}: {err}; leaving it to that worker")
        raise
    except (Interrupted, DataError):
        # A stop signal (its checkpoint saved), or data that is missing or damaged (the same for
        # every trial): the worker stops and the trial stays RUNNING, taken over by the next
        # run of the command, so it spends no place in the budget.
        raise
    except Exception as err:  # a user error (diverged) or the device's (out of memory)
        what = str(err) if isinstance(err, LRAError) else f"{type(err).__name__}: {err}"
        trial.set_user_attr("error", what.splitlines()[0] if what else type(err).__name__)
        study.tell(number, state=optuna.trial.TrialState.FAIL)
        log.error(f"trial {number} failed: {what}")
        return
    study.tell(number, float(record["val_accuracy"]))
    log.info(f"trial {number}: val accuracy {record['val_accuracy']:.4f} ({record['run_key']})")


def _take_orphan(ctx: Context, study) -> bool:
    """Resume one trial whose worker died; whether there was one."""
    optuna = studies.optuna()
    for frozen in studies.orphans(study, ctx.claims):
        claim = studies.Claim(ctx.claims, frozen.number)
        if not claim.take():
            continue  # another worker took it first
        try:
            fresh = study._storage.get_trial(frozen._trial_id)
            if fresh.state.name != "RUNNING":
                continue
            log.info(f"trial {frozen.number}: its worker is gone; resuming its run folder")
            trial = optuna.trial.Trial(study, frozen._trial_id)
            trial.set_user_attr(studies.WORKER, studies.worker_name())
            try:
                _train_trial(ctx, study, trial, dict(frozen.user_attrs[studies.OVERRIDES]))
            except RunLocked:
                continue  # a live worker trains its run folder: taken up again once it is done
        finally:
            claim.release()
        return True
    return False


def _others_running(study) -> bool:
    return any(t.state.name in ("RUNNING", "WAITING") for t in studies.counted(study))


def search(ctx: Context) -> None:
    """Take trials until the budget is spent and every trial of the study has ended."""
    study = ctx.study
    while True:
        if _take_orphan(ctx, study):
            _trial_ended(ctx, study)
            continue
        if len(studies.counted(study)) >= ctx.n_trials:
            if _others_running(study):  # another worker's trial: its value may be the best
                time.sleep(float(ctx.cfg.tune.poll_seconds))
                continue
            return
        _ask_and_train(ctx, study)
        _trial_ended(ctx, study)


def _trial_ended(ctx: Context, study) -> None:
    """The study file rewritten and the console's progress line, after each trial."""
    write_summary(ctx, study)
    log.info(progress_line(study, ctx.n_trials))


def _ask_and_train(ctx: Context, study) -> None:
    optuna = studies.optuna()
    trial = study.ask()
    claim = studies.Claim(ctx.claims, trial.number)
    if not claim.take():  # cannot happen for a fresh trial; be safe
        raise RuntimeError(f"trial {trial.number} of {ctx.name} is claimed already")
    try:
        if not studies.within_budget(study, trial.number, ctx.n_trials):
            trial.set_user_attr(studies.OVER_BUDGET, True)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            return
        values = draw(ctx, study, trial)
        cfg = trial_config(ctx, values)
        trial.set_user_attr(studies.OVERRIDES, values)
        trial.set_user_attr(
            studies.RUN_DIR,
            str(run_dir(cfg.results_dir, OmegaConf.to_container(cfg, resolve=True))),
        )
        trial.set_user_attr(studies.WORKER, studies.worker_name())
        log.info(f"trial {trial.number}: {_shown(values)}")
        try:
            _train_trial(ctx, study, trial, values)
        except RunLocked:
            return  # the trial stays RUNNING with a free claim: the other worker's run ends it
    finally:
        claim.release()


def draw(ctx: Context, study, trial) -> dict:
    """Trial ``trial``'s values, drawn by the sampler of its number (:func:`studies.reseed`)."""
    studies.reseed(study, ctx.cfg, ctx.space, trial.number)
    return suggest(trial, ctx.space)


def _shown(values: dict) -> str:
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
