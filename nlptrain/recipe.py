"""The recipe of `nlptrain train`, from a task to a finished run (`eval_recipe`: `nlptrain eval`).

Read top to bottom: start the backend, check and load data and model (errors come before the run
directory is touched), build the trainer with its callbacks, train, test, export.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nlptrain import distributed, kinds, losses, models
from nlptrain.callbacks import EMA, Checkpointer, MetricLogger, ProgressBar, SaveBestModel
from nlptrain.command_end import resume_said
from nlptrain.config import TaskConfig, file_spec
from nlptrain.data import Collator, build_datasets
from nlptrain.data.readers import read_format
from nlptrain.durable import clear_leftovers, open_durably, write_text
from nlptrain.environments import Environment
from nlptrain.errors import ConfigError
from nlptrain.events import Callback
from nlptrain.launch import exit_told_at_once
from nlptrain.models import check_max_length, load_config, load_model, load_tokenizer
from nlptrain.random_state import seed_everything
from nlptrain.resume_checks import check_resume
from nlptrain.run_record import keep_reached_epochs, read_config, record_in_config
from nlptrain.runs import (
    RunDirLock,
    RunRecordBefore,
    began_in_this_launch,
    disk_use_line,
    forget_unstarted_run,
    launch_run_dir,
    new_run_dir,
    out_of_space_said,
    prepare_run_dir,
    refused_before_training,
)
from nlptrain.scores import strict_json
from nlptrain.task_files import validate
from nlptrain.trainer import DistTrainer

log = logging.getLogger("nlptrain")


@dataclass
class RunOptions:
    """Options of one launch that are not part of the task."""

    output_dir: str = ""
    resume: bool = False
    overwrite: bool = False
    use_cache: bool = True
    # Also log to RUN_DIR/tensorboard (when the package is installed); None: as the run resumed
    # did (it has that folder), else not.
    tensorboard: bool | None = None
    progress_every_s: float = 30.0  # a progress line this often when stderr is not a terminal
    callbacks: list[Callback] = field(default_factory=list)
    callback_specs: list[str] = field(default_factory=list)  # what made `callbacks` (config.json)


@contextmanager
def backend(timeout: float, environment: Environment | None = None
            ) -> Iterator[distributed.Backend]:
    """The process group of the launcher's environment (detected unless given), torn down after."""
    dist = distributed.from_env(timeout, environment)
    try:
        yield dist
    except BaseException:
        dist.close(failed=True)
        raise
    dist.close()


def collator(tokenizer: Any, task: TaskConfig) -> Collator:
    pad_to = task.model.max_length if task.train.padding == "max_length" else None
    return Collator(tokenizer.pad_token_id or 0, pad_to, task.train.pad_to_multiple_of,
                    task.model.max_length)


def train(task: TaskConfig, opts: RunOptions, dist: distributed.Backend) -> dict[str, Any]:
    """Fine-tune per `task`; returns {"valid": metrics, "test": metrics} (None where absent)."""
    validate(task, f"task {task.name}")  # (a TaskConfig built in Python was never checked)
    if opts.resume and opts.output_dir:  # a resume that cannot fit is refused before any data is read
        dist.on_main(lambda: check_resume(Path(opts.output_dir), task.to_dict()))
    tokenizer = load_tokenizer(task.model.name)
    check_max_length(load_config(task.model.name), task.model.max_length, f"task {task.name} [model]")
    train_file = file_spec(task, "train")
    pairs = bool(train_file and train_file.text_pair_column != "")
    models.check_room_for_text(tokenizer, task.model.max_length, pairs, f"task {task.name} [model]")
    sets = build_datasets(task, tokenizer, dist, use_cache=opts.use_cache)
    config = task.train
    if task.data.streaming:  # rows counted once; every rank takes one pass of the shortest share
        from nlptrain.data.streaming import prepare_stream

        config = prepare_stream(sets.train, task.train, dist)
    kind = kinds.from_task(task)
    # The labels are known now, also those read from the data.
    kind.check(sets.vocab.names, config.metric_for_best, f"task {task.name}")
    # Checked now, not in the trainer: a mistake must not leave a run directory that refuses the
    # corrected command ("already holds a run").
    losses.class_weights(kind, config.class_weights, sets.train, sets.vocab.names)
    if config.early_stopping and sets.valid is None:
        raise ConfigError(
            f"task {task.name}: [train] early_stopping = {config.early_stopping} needs a validation "
            "set. Without one the evaluations during training score the test set, and stopping on "
            "them would tune the run on its test set. Give [data] valid = FILE or valid_size = 0.1 "
            "(--valid-size 0.1), or drop early_stopping.")
    seed_everything(task.train.seed)  # the new classifier head starts the same on every rank
    model = load_model(task.model.name, sets.vocab.names, task.model.num_hidden_layers, kind,
                       says=dist.is_main)
    if train_file:  # `predict` reads the same columns unless told otherwise
        model.config.nlptrain_columns = {"text": train_file.text_column,
                                         "text_pair": train_file.text_pair_column,
                                         "header": train_file.header, "quoted": train_file.quoted,
                                         "format": read_format(train_file)}  # (auto: resolved)
    with open_run_dir(task, opts, dist) as (run_dir, has_run, refused), out_of_space_said(run_dir):
        log_sizes(task, sets, dist)

        # --tensorboard, --no-tensorboard, or on a resume as the run did: decided once here
        opts = dataclasses.replace(opts, tensorboard=logs_to_tensorboard(opts, run_dir))
        callbacks, best = run_callbacks(task, opts, sets, run_dir)
        eval_set = sets.valid if sets.valid is not None else sets.test
        # Resumed from the newest whole checkpoint (rank 0 checks, every rank takes its choice), it
        # goes on as the run began: weights, data position, "auto"'s precision.
        with refused_before_training(refused, lambda: 0):
            trainer = DistTrainer(model, sets.train, eval_set, config=config, callbacks=callbacks,
                                  tokenizer=tokenizer, collate=collator(tokenizer, task), dist=dist,
                                  kind=kind, resume_from=run_dir / "checkpoints" if has_run else None,
                                  progress=False)  # run_callbacks's, where the log level is info
        started_at = trainer.global_step
        task.train.precision = trainer.config.precision  # (report, model card: config.json's record)
        reached = trainer.epoch + bool(trainer.batch_in_epoch)  # (a resume's: epochs begun)
        if reached > task.train.epochs:  # fewer asked than reached: nothing trains, said as such
            dist.on_main(lambda: keep_reached_epochs(run_dir, reached))
        try:
            dist.on_main(lambda: record_in_config(run_dir, "precision", trainer.precision.record()))
            # (what a later plain --resume follows)
            dist.on_main(lambda: record_in_config(run_dir, "tensorboard", opts.tensorboard))
            with resume_said(run_dir), exit_told_at_once(), refused_before_training(
                    refused, lambda: trainer.global_step - started_at):
                trainer.fit()
            results = final_metrics(trainer, sets, best, run_dir)
            found = trainer.predictions if results["test"] else None  # the test set's, if scored
            trainer.strategy.export(trainer.model, tokenizer, run_dir / "model")  # on every rank
            dist.on_main(lambda: write_outputs(run_dir, results, task, sets, found))
        finally:
            trainer.close()
    final = results["test"] or results["valid"]
    if final:
        log.info("%s: %s on %d rows; model saved to %s", "test" if results["test"] else "valid",
                 kind.summary(final, trainer.metric_for_best), final["rows"], run_dir / "model")
    dist.on_main(lambda: log.info("%s", disk_use_line(run_dir)))
    return results


@contextmanager
def open_run_dir(task: TaskConfig, opts: RunOptions,
                 dist: distributed.Backend) -> Iterator[tuple[Path, bool, Callable[[], None]]]:
    """Rank 0 makes (or reopens, to resume) the run directory and holds its lock (`RunDirLock`)
    until the block ends; every rank learns its path, whether there is a run to resume, and how
    to put the run's record back as it was (a resume that its checkpoint refuses)."""
    # A launcher's restart (torchrun/--nproc --max-restarts, a requeued SLURM job) starts the
    # same command again: it resumes by itself.
    launch = dist.environment

    def make() -> tuple[str, bool]:
        if opts.output_dir:
            folder, overwrite = Path(opts.output_dir), opts.overwrite
            resume = opts.resume or (launch.restart_count > 0 and began_in_this_launch(folder, launch))
        else:  # a generated name: this launch's own on a restart, else new and empty, never
            # another run's (--resume and --overwrite are for a folder the user names)
            mine = launch_run_dir(task.name, launch=launch)
            folder, resume, overwrite = mine or new_run_dir(task.name), mine is not None, False
            if mine is None and (opts.resume or opts.overwrite):  # said: else a silent new run
                log.warning("%s without --output-dir: a new run starts in %s; give --output-dir "
                            "to continue or replace a run", "--resume" if opts.resume
                            else "--overwrite", folder)
        made_here = not folder.exists()
        lock.acquire(folder)
        try:
            if resume:
                record.keep(folder)
            with out_of_space_said(folder):
                found = prepare_run_dir(folder, task.to_dict(), dist.world_size, resume=resume,
                                        overwrite=overwrite, launch=launch,
                                        callbacks=opts.callback_specs)
        except BaseException:
            lock.release(refused=True)
            raise
        if found:  # the lock says that no one writes there now: what is half-written is a crash's
            cleared = clear_leftovers(folder) + clear_leftovers(folder / "checkpoints")
            if cleared:
                log.info("%s: cleared what a crash left half-written: %s", folder, ", ".join(cleared))
        else:
            new_run.append((folder, made_here))
        return str(folder), found

    lock, record = RunDirLock(), RunRecordBefore()
    new_run: list[tuple[Path, bool]] = []  # (folder, made by this run), where this process made it
    folder: str | None = None
    try:
        folder, has_run = dist.on_main(make)
        log.info("run directory: %s", folder)
        yield Path(folder), has_run, record.put_back
    except BaseException as error:
        forgotten = bool(new_run) and forget_unstarted_run(*new_run[0])  # the lock is still held
        if forgotten and not isinstance(error, KeyboardInterrupt):  # (a stop says its own)
            log.info("%s: the run failed before it wrote anything: removed, so that the same "
                     "command may start there", new_run[0][0])
        if isinstance(error, KeyboardInterrupt):  # for the command line's word on how to go on
            error.run_dir = None if forgotten or folder is None else Path(folder)
        raise
    finally:
        lock.release()


def run_callbacks(task: TaskConfig, opts: RunOptions, sets: Any,
                  run_dir: Path) -> tuple[list[Callback], SaveBestModel | None]:
    """The callbacks of a CLI run (the trainer adds lr schedule, clipping, early stopping)."""
    scores_valid = sets.valid is not None  # else the evaluations score the test set
    callbacks: list[Callback] = [
        MetricLogger(run_dir / "metrics.jsonl", task.train.log_every, marks_best=scores_valid),
        Checkpointer(run_dir / "checkpoints", task.train.checkpoint_every,
                     task.train.keep_checkpoints, task.train.checkpoint_minutes)]
    if log.isEnabledFor(logging.INFO):  # progress is info: --log-level warning is quiet
        callbacks.insert(0, ProgressBar(log_every_s=opts.progress_every_s, marks_best=scores_valid,
                                        eval_name="validation" if scores_valid else "test"))
    best = SaveBestModel(run_dir / "best") if scores_valid else None
    if best is not None:
        callbacks.append(best)
    if task.data.train_shards:  # each rank swaps in its own file at on_train_start
        from nlptrain.callbacks import PerRankData

        callbacks.append(PerRankData.from_task(task, sets.vocab, opts.use_cache))
    if opts.tensorboard:
        from nlptrain.callbacks.tensorboard import TensorBoardLogger

        callbacks.append(TensorBoardLogger(run_dir / "tensorboard"))
    return [*callbacks, *opts.callbacks], best


def logs_to_tensorboard(opts: RunOptions, run_dir: Path) -> bool:
    """--tensorboard or --no-tensorboard, else a resume goes on as the run did (config.json
    records it; a run from before that record, by its tensorboard/ folder)."""
    if opts.tensorboard is not None:
        return opts.tensorboard
    if not opts.resume:
        return False
    return bool((read_config(run_dir) or {}).get("tensorboard", (run_dir / "tensorboard").is_dir()))


def final_metrics(trainer: DistTrainer, sets: Any, best: SaveBestModel | None,
                  run_dir: Path) -> dict[str, Any]:
    """Validation metrics of the model kept (the best one, loaded back), and its test metrics."""
    results: dict[str, Any] = {"valid": None, "test": None}
    latest = {k: v for k, v in trainer.metrics.items() if k not in ("epoch", "step")}
    if sets.valid is not None:
        results["valid"] = latest
        # An EMA that exports an average it never evaluated: the average, not best/ (the
        # trained weights' best), is the model kept, scored here.
        unevaluated = any(c.export and not c.evaluate for c in trainer.callbacks.find(EMA))
        if unevaluated:
            results["valid"] = trainer.evaluate(sets.valid)
            results["model"] = "the weights' average at the end (EMA), not `best/`"  # (report.md)
        elif best is not None and best.saved_metrics is not None:
            trainer.strategy.load_full_weights(trainer.model, run_dir / "best" / "model.safetensors")
            results["valid"] = best.saved_metrics
    if sets.test is not None:
        # Without a validation set the loop evaluated on the test set: reuse it if it is current
        # and scored the weights kept (an EMA that exports what it did not evaluate, or evaluates
        # what it does not export, changed them after).
        scored_others = any(c.export != c.evaluate for c in trainer.callbacks.find(EMA))
        current = sets.valid is None and trainer.metrics.get("step") == trainer.global_step \
            and trainer.predictions is not None and not scored_others  # (a resume: metrics alone)
        results["test"] = latest if current else trainer.evaluate(sets.test)
    return results


def write_outputs(run_dir: Path, results: dict[str, Any], task: TaskConfig, sets: Any,
                  found: Any = None) -> None:
    """What a finished run leaves for people, beside config.json, metrics.jsonl and model/:
    results.json (with the data sizes), predictions.npz (the test set's outputs and targets),
    plots/*.png, report.md and model/README.md (the model card), the last three rebuilt from
    files."""
    from nlptrain.model_card import write_model_card
    from nlptrain.plots import PREDICTIONS_FILE, plot_run
    from nlptrain.report import write_report

    data = {}
    for name in ("train", "valid", "test"):
        if sets.rows(name) is not None:
            spec = file_spec(task, name)
            source = sets.sources.get(name) or (spec.path if spec else "")
            if name == "train" and sets.sources.keys() & {"valid", "test"}:
                source += " (less the held-out rows)"
            data[name] = {"rows": sets.rows(name), "source": source}
    write_text(run_dir / "results.json", json.dumps(strict_json({**results, "data": data}), indent=1))
    if found is not None:
        with open_durably(run_dir / PREDICTIONS_FILE, "wb") as handle:  # whole or not at all
            np.savez_compressed(handle, outputs=found.outputs, targets=found.labels)
    if (run_dir / "metrics.jsonl").is_file():  # (not when no step ran)
        plot_run(run_dir)
    write_report(run_dir)
    write_model_card(run_dir)


def log_sizes(task: TaskConfig, sets: Any, dist: distributed.Backend) -> None:
    sizes = ", ".join(f"{name} {sets.rows(name)}" for name in ("train", "valid", "test")
                      if sets.rows(name) is not None)
    kind = kinds.from_task(task)
    outputs = f"labels {sets.vocab.names}" if kind.has_classes else f"a score ({kind.name})"
    log.info("task %s: %s rows; %s", task.name, sizes, outputs)
    train = task.train
    accumulated = f" x {train.grad_accum} accumulated" if train.grad_accum > 1 else ""
    if train.max_tokens:
        batch = f"batches of up to {train.max_tokens} tokens per process{accumulated}"
    else:
        batch = (f"batch {train.batch_size} per process{accumulated}, "
                 f"{train.batch_size * train.grad_accum * dist.world_size} per optimizer step")
    log.info("%d process(es) on %s: %s", dist.world_size, dist.device, batch)
    log.info("training: %s", settings_line(task))


SHOWN_SETTINGS = ("epochs", "lr", "scheduler", "warmup_ratio", "weight_decay", "max_grad_norm", "seed")
SAID_ELSEWHERE = ("batch_size", "grad_accum", "max_tokens", "precision")  # their own lines


def settings_line(task: TaskConfig) -> str:
    """The [train] settings a run is most often told apart by, then any other that differs from
    its default (config.json holds them all)."""
    train, default = task.train, type(task.train)()
    changed = [f.name for f in dataclasses.fields(train) if f.name not in SHOWN_SETTINGS +
               SAID_ELSEWHERE and getattr(train, f.name) != getattr(default, f.name)]

    def said(name: str) -> str:
        value = getattr(train, name)
        return f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"

    line = ", ".join([*map(said, SHOWN_SETTINGS), f"max_length {task.model.max_length}"])
    return line + (f"; also {', '.join(map(said, changed))}" if changed else "")
