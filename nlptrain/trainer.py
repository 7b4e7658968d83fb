"""The training loop: one loop, fired events, two ways to run it.

`fit`, `_train_epochs` and `_train_batch` below are the whole loop; each event is fired from one
line of them (the checkpoint events from `callback_states` / `load_callback_states`). What the
ranks agree on, each optimizer step and at a stop, is `nlptrain.step_agreement`'s. `DistTrainer`
is the same class with the distributed backend from `nlptrain.distributed`: the loop calls only
the backend's collectives and its strategy's methods (`wrap_model`, `no_sync`, `evaluating`;
`nlptrain.strategies`: one device, DDP, FSDP2) and never tests ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from nlptrain import checkpoint, distributed, host_memory, losses, models, optim, precision, strategies
from nlptrain.config import TrainConfig
from nlptrain.data.hf_datasets import as_dataset, batch_targets_problem
from nlptrain.errors import ConfigError, TrainingError
from nlptrain.evaluate import Predictions, check_eval_batch, compute_metrics, logits_of, model_inputs, predict
from nlptrain.events import Callback, CallbackList, listed_callbacks
from nlptrain.kinds import TaskKind
from nlptrain.progress import Progress, ProgressCounters
from nlptrain.random_state import seed_everything
from nlptrain.scores import best_score
from nlptrain.signals import stop_on_signals
from nlptrain.step_agreement import AgreedStep, LatestStepReadings, StepAgreement, StepWindow
from nlptrain.task_files import train_config, validate_finetuning
from nlptrain.train_batches import TrainBatches
from nlptrain.trainer_arguments import (
    check_metric_for_best_given,
    default_collate,
    job_step_of,
    listed_metrics,
    task_of,
    warn_if_nothing_to_train,
    warn_if_the_lr_is_zero,
)

log = logging.getLogger(__name__)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, targets) -> loss
MetricFn = Callable[[Predictions], dict[str, Any]]  # gathered predictions -> numbers (or lists)
CollateFn = Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]  # rows -> a batch


class Trainer(ProgressCounters, LatestStepReadings, StepAgreement):
    """Fine-tunes a sequence classifier in one process: a `transformers` model, or a module of
    your own whose `forward(input_ids, attention_mask[, token_type_ids])` returns logits (a
    tensor, or an object/dict with `logits`). Seams (README, "Fine-tuning techniques"): the loss
    is `loss_fn(forward(batch), batch["labels"])`, the kind's by default, and a callback may
    replace `loss_fn` or call `forward` again; the optimizer is `optimizer(param_groups(model,
    lr, config), config)`, both optional functions (default: AdamW, `nlptrain.optim`).
    `resume_from`: a checkpoint, or a `Checkpointer`'s folder (its newest whole checkpoint, if
    any), loaded here: the trainer starts in its state and, under "auto", its precision.
    `progress`: a `ProgressBar` on the main process (plain lines where stderr is not a terminal)
    unless `callbacks` holds one; False: none. Seeds Python's, NumPy's and torch's generators
    from `config.seed`, as `transformers.Trainer` does."""

    def __init__(
        self,
        model: torch.nn.Module,
        train_data: Dataset | Iterable | None = None,
        eval_data: Dataset | Sequence[Any] | None = None,  # rows: a list of dicts too
        *,
        config: TrainConfig | dict[str, Any] | None = None,
        callbacks: Sequence[Callback] = (),
        tokenizer: Any = None,
        collate: CollateFn | None = None,
        dist: distributed.Backend | None = None,
        kind: TaskKind | str | None = None,  # an instance, or its name: "regression"
        label_names: Sequence[str] | None = None,
        metrics: Sequence[MetricFn] = (),
        strategy: strategies.Strategy | None = None,
        param_groups: optim.ParamGroupsFn | None = None,
        optimizer: optim.OptimizerFn | None = None,
        resume_from: str | Path | None = None,
        progress: bool = True,
    ) -> None:
        self.dist = dist or distributed.SingleProcess()
        self.device = self.dist.device
        self.config = config = train_config(config)  # checked; its precision decided below
        # Dropout's masks and the data order are the seed's, from Python as from the command
        # line (a resume's checkpoint then sets the generators as they were).
        seed_everything(config.seed)
        # A checkpoint, or a Checkpointer's folder (its newest whole one; none yet: from scratch).
        self.resumed_from = checkpoint.checkpoint_to_resume(resume_from, self.dist)
        self.resume_asked = resume_from is not None  # also where no checkpoint was written yet
        # The kind owns the loss, the outputs and the metrics; a transformers model says its own.
        self.kind, self.label_names = task_of(model, kind, label_names)
        self.metric_fns = listed_metrics(metrics)  # a user's own, on the gathered predictions
        self.kind.check(self.label_names, "" if self.metric_fns else self.metric_for_best, "Trainer")
        validate_finetuning(config, self.kind, "Trainer(config=...)")  # the kinds they fit
        self.tokenizer = tokenizer
        self._positions = models.usable_positions(model)  # no data set's row may be longer
        self.train_data = train_data = self._as_dataset(train_data, "train")
        eval_data = self._as_dataset(eval_data, "valid")
        self.collate = collate or default_collate(model, config)
        # "auto": what this device runs fastest (measured; rank 0's), or what a resumed run began in.
        self.precision = precision.choose(config.precision, self.device, self.dist, self.resumed_from,
                                          job_step_of(model, train_data, self.collate, config))
        self.config = replace(config, precision=self.precision.precision)
        if getattr(model, "config", None) is not None:  # an export then scores as it trained
            model.config.nlptrain_precision = self.precision.precision  # (eval, predict: "auto")
            model.config.nlptrain_eval_batches = models.eval_batches_record(self.collate, config)
        if self.device.type == "cpu" and config.keep_freed_memory:  # no page faults each step
            host_memory.keep_freed_memory()
        # (logits, targets) -> loss; callbacks may replace it. Class weights come from train_data.
        self.loss_fn: LossFn = losses.task_loss(self.kind, self.config, train_data, self.label_names)
        self.strategy = strategy or strategies.make_strategy(self.config, self.dist)
        models.record_how_rows_were_read(model, train_data)  # for the export's predict
        precision.logits_in_fp32(model, self.kind.output_size(self.label_names))  # not bf16's
        models.prepare_for_training(model, self.config, self.device)  # dropout, checkpointing, compile
        self.model = self.strategy.wrap_model(model)  # the optimizer is made after: FSDP2 shards
        self.eval_data = eval_data
        self.optimizer = optim.make_optimizer(self.unwrapped_model, self.config, self.dist.world_size,
                                              param_groups, optimizer)
        if self.is_main:
            warn_if_the_lr_is_zero(self.optimizer)
        self.scheduler: Any = None  # made by the LRSchedule callback once steps are known
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.config.precision == "fp16")
        from nlptrain.callbacks import with_config_callbacks  # a package of callbacks: imported late

        self.callbacks = CallbackList(with_config_callbacks(listed_callbacks(callbacks), self.config,
                                                            progress), self.dist.is_main)
        self.progress = Progress()   # epoch, global_step, ...: callbacks read, checkpoints save
        self.is_update_step = False  # this micro-batch ends with an optimizer step (none: False)
        self.batch: dict[str, torch.Tensor] = {}  # this micro-batch, on the device (for loss_fn)
        # The latest optimizer step's agreed flags (a resume's: its totals), read by step_loss and
        # step_rows; step_lr: the lr its update used (the schedule moves on at on_step_end).
        self.latest_step: AgreedStep | checkpoint.StepTotals | None = None
        self.step_lr = 0.0
        self.window = StepWindow()   # the micro-batches of the optimizer step under way
        self._pending: AgreedStep | None = None  # the latest step's agreed flags, not yet read
        self._stop_agreed = False    # every rank has read a stop: the run ends after this step
        self.save_asked_at: int | None = None  # read by every rank: a save asked after that step
        self.metrics: dict[str, Any] = {}
        self.predictions: Predictions | None = None  # the latest evaluation's, gathered
        self.should_stop = self.should_save = False  # any rank's requests: agreed in the flags
        self.interrupted = False
        self.train_batches = TrainBatches(self.dist, self.device)  # each epoch's, of train_data
        self._failed, self._owns_dist, self._fits = False, dist is None, 0
        self._loaded_optimizer = self.optimizer if self.resumed_from is not None else None
        if self.resumed_from is not None:
            try:  # weights, optimizer, progress, every rank's RNG, the callbacks' state
                checkpoint.load_checkpoint(self, self.resumed_from)
            except BaseException:
                self._failed = True
                self.close()  # no DDP wrapper left for the traceback to hold at exit
                raise

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        return self.strategy.unwrap(self.model)

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    def fit(self) -> dict[str, Any]:
        """Train for `config.epochs` (or until a callback stops it); returns the latest
        evaluation's metrics, or without eval data the epochs run, the steps and the last loss.
        Called again, it goes on from the last whole step (after a callback's stop, once
        `should_stop` is set back to False), the rest of a stopped epoch first."""
        started_at = self.global_step
        if self.interrupted:  # a signal's stop ended the last fit, not the run: fit() again goes on
            self.should_stop = False
        self._failed = self.interrupted = False  # how the last fit ended is not this one's
        with stop_on_signals(self._request_stop, say=self.is_main):
            try:
                self.callbacks.fire("on_train_start", self)
                if self.latest_step is None:  # no step yet: the optimizer's lr (the schedule,
                    self.step_lr = optim.logged_lr(self.optimizer)  # made at the first batch, sets it)
                self._check_before_training()
                self._stop_agreed = False  # the last fit's stop: should_stop decides this one's
                self._train_epochs()
            except BaseException as error:
                self._failed = True
                self.callbacks.fire("on_exception", self, error, failing=True)
                said = distributed.as_peer_failure(error, self.dist.rank, self.global_step) or \
                    distributed.as_timeout(error)
                if said is not None:  # not the transport's traceback, under any launcher
                    raise said from None
                raise
            finally:
                self.callbacks.fire("on_train_end", self, failing=self._failed)
        ended_before = self.resumed_from is not None and self.global_step == started_at
        if ended_before and self.predictions is None and self.eval_data is not None:  # (a crash
            # in its export, say): the scores of the weights it ended with, as its own fit returned
            self.metrics = {**self.evaluate(self.eval_data), "epoch": self.epoch,
                            "step": self.global_step}
        return self.metrics or {"epoch": self.epoch + bool(self.batch_in_epoch), "step": self.global_step,
                                "train_loss": self.last_loss}  # (epochs begun)

    def _train_epochs(self) -> None:
        while not self._agree_on_stop() and self.epoch < self.config.epochs:
            self.callbacks.fire("on_epoch_start", self)
            self.model.train()
            for batch in self._epoch_batches():  # read after the event: it may swap the data
                if not self._train_batch(batch):  # a stop asked on any rank stops all
                    break
            self.is_update_step = False  # no micro-batch under way: the epoch's events see none
            self.settle()  # the last step's flags, before the epoch's decisions
            # Every rank leaves together; a signal read after the epoch's last step lets the epoch
            # end first (its evaluation: a resume starts at the next epoch), the while test raises.
            self._agree_on_stop(interrupt=not self.progress.ended_epoch())
            if self.metrics.get("step") != self.global_step:
                self.validate()  # at each epoch end, unless eval_every just did
            self.callbacks.fire("on_epoch_end", self)
            if self.progress.ended_epoch() or not self.should_stop:  # a stop mid-epoch leaves the
                self.progress.next_epoch()  # counters where it stopped, as its checkpoint does

    def _check_before_training(self) -> None:
        """An optimizer put in place of the one a checkpoint loaded into (before fit, or in
        on_train_start) would go on without its state: refused, once (a later fit may). A fit()
        again with nothing to train says so."""
        if self._fits and self.is_main:
            warn_if_nothing_to_train(self.progress, self.config.epochs, self.should_stop)
        if self.eval_data is not None:  # (training reads no index: a collate may have dropped it)
            check_eval_batch(self._as_dataset(self.eval_data, "eval"), self.collate)
            if self.metric_fns and not self._fits:
                check_metric_for_best_given(self)
        if self._fits:  # the last fit may have ended inside an epoch (a stop, a signal, an
            # error): this one trains the rest from its last whole step, as a resume from there
            # would. A step an error cut short is undone (its gradients, its random state).
            if self.window.begun:
                self.progress.batch_in_epoch = self.window.undo()
            self.optimizer.zero_grad(set_to_none=True)
            self.settle()  # (the last step's rows counted)
            if self.progress.batch_in_epoch:
                self.train_batches.resume_samples = self.progress.samples_in_epoch
        self._fits += 1
        loaded, self._loaded_optimizer = self._loaded_optimizer, None
        if loaded not in (None, self.optimizer):
            raise ConfigError("trainer.optimizer was replaced after resume_from loaded the checkpoint "
                              "into the Trainer's own: give Trainer(optimizer=make) instead, which "
                              "builds yours before the checkpoint loads into it")

    def _train_batch(self, batch: dict[str, torch.Tensor]) -> bool:
        """One micro-batch; False when a stop asked on some rank ends the epoch here."""
        cfg = self.config
        if self._stop_agreed:  # read at a checkpoint or evaluation: every rank stops here
            return False
        self.is_update_step = self._ends_accumulation()
        left = self.batches_per_epoch - self.batch_in_epoch  # at a window's start: its size, capped
        self.window.open(self.batch_in_epoch, min(cfg.grad_accum, left))  # a no-op inside a window
        self.batch = batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        self.callbacks.fire("on_batch_start", self, batch)
        with self.strategy.no_sync(self.model, skip_sync=not self.is_update_step):
            with precision.autocast(self.device, cfg.precision):
                loss = self.loss_fn(self.forward(batch), batch["labels"])
            self.callbacks.fire("on_loss", self, loss)
            self.callbacks.fire("on_backward_start", self)
            self.backward(loss)
        self.callbacks.fire("on_backward_end", self)
        self.window.add(loss, len(batch["labels"]))  # on the device: no host sync
        self.progress.batch_in_epoch += 1
        if self.is_update_step:
            if not self._agree_on_step():
                return False
            self._optimizer_step()
            self.progress.global_step += 1
            self.callbacks.fire("on_step_end", self)
            if self.global_step == cfg.max_steps:  # known alike on every rank: nothing to agree,
                self.should_stop = self._stop_agreed = True  # so nothing is begun past it
            if cfg.eval_every and self.global_step % cfg.eval_every == 0:
                self.validate()
        self.callbacks.fire("on_batch_end", self)  # the micro-batch is over, its evaluation too
        return True

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The (wrapped) model's logits on a batch on the device; callbacks call it for extra
        passes (R-Drop, FGM): under DDP, several forwards before one backward all-reduce once."""
        return logits_of(self.model(**model_inputs(batch)))

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of this micro-batch's mean loss, weighted by its share of the step's rows (all
        ranks; `StepWindow.loss_divisor`) and scaled for fp16; callbacks' extra passes too (FGM),
        from `on_batch_start` to `on_backward_end` (after it, the weight is the next one's)."""
        if not self.window.taking:  # its gradient would go into the next step, weighed wrongly
            raise TrainingError("trainer.backward() runs a micro-batch's passes: call it from "
                                "on_batch_start to on_backward_end, not after them")
        divisor = self.window.loss_divisor(self.dist.world_size)
        weighted = loss if divisor == 1.0 else loss / divisor  # (a launch saved where it is 1)
        self.scaler.scale(weighted).backward()

    def rewrap_model(self) -> None:
        """Wrap again (DDP registers the parameters that require grad): on every rank at the
        same step after changing `requires_grad` (see Freeze)."""
        self.model = self.strategy.rewrap(self.model)

    def validate(self) -> dict[str, Any]:
        """Evaluate on `eval_data`, decide `is_best`, fire the valid events."""
        self.settle()  # every rank evaluates at the same step: a point to read the flags
        if self.eval_data is None:
            return {}
        in_step, self.is_update_step = self.is_update_step, False  # an evaluation is no micro-batch
        self.callbacks.fire("on_valid_start", self)
        metrics = self.evaluate(self.eval_data)
        score = best_score(metrics, self.metric_for_best)
        # Metrics are gathered, hence equal on every rank: so is this decision.
        is_best = self.kind.is_better(self.metric_for_best, score, self.best_metric, self.config.best_is)
        if is_best:
            self.progress.best_metric = score
        # epoch counted from 1, as every log, report and results.json say it
        self.metrics = {**metrics, "epoch": self.epoch + 1, "step": self.global_step}
        self.callbacks.fire("on_valid_end", self, self.metrics, is_best)
        self.is_update_step = in_step  # (an eval_every step's on_batch_end comes next)
        # A stop decided on the evaluation (early stopping) ends the run at this step on every
        # rank; the evaluation has synced the ranks already, so agreeing now costs no stall.
        if self._agree_on_stop(interrupt=False):
            self._stop_agreed = True
        return self.metrics

    @property
    def metric_for_best(self) -> str:
        return self.config.metric_for_best or self.kind.default_metric

    def evaluate(self, data: Dataset | Sequence[Any]) -> dict[str, Any]:
        """Metrics on `data`, computed from every rank's predictions, duplicates excluded: the
        kind's, then the user's own (`metrics=`), all on the same gathered predictions."""
        with self.strategy.evaluating(self.model):
            found = predict(self.unwrapped_model, self._as_dataset(data, "eval"), self.dist,
                            self.collate, self.config.eval_batch_size, self.config.precision,
                            self.kind, self.strategy.eval_needs_equal_steps, self.label_names)
        self.predictions = found
        return compute_metrics(found, self.label_names, self.kind, self.metric_fns, warn=self.is_main)

    # -- the pieces of the loop ------------------------------------------------------------

    def _epoch_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        kind, names = self.kind, self.label_names
        return self.train_batches.of_epoch(self.train_data, lambda data: self._as_dataset(data, "train"),
                                           self.config, self.collate, self.progress, self.window,
                                           lambda targets: batch_targets_problem(targets, kind, names))

    def _as_dataset(self, data: Any, what: str) -> Any:
        """A 🤗 `datasets.Dataset` tokenized (columns text, label[, text_pair]); else as is. An
        evaluation set must hold what the train set holds: pairs, or single texts."""
        like = getattr(self, "train_data", None) if what != "train" else None
        return as_dataset(data, self.tokenizer, self.label_names, self.kind, what, like=like,
                          positions=self._positions)

    def _ends_accumulation(self) -> bool:
        done = self.batch_in_epoch + 1  # this micro-batch included
        return done % self.config.grad_accum == 0 or done == self.batches_per_epoch

    # -- the checkpoint events, fired from here alone whatever writes or reads the checkpoint
    # (checkpoint.py saves the counters, `progress`, the latest step and evaluation too)

    def callback_states(self) -> dict[str, Any]:
        """What the callbacks add to a checkpoint being written (on_save_checkpoint)."""
        states = self.callbacks.state_dict_to_fill()  # {WRITTEN_BY: ...}; each keeps its own keys
        self.callbacks.fire("on_save_checkpoint", self, states)
        return checkpoint.plain_state(dict(states))  # numpy numbers made plain; the unloadable refused

    def load_callback_states(self, states: dict[str, Any]) -> None:
        """Give the callbacks their state back from a loaded checkpoint (on_load_checkpoint)."""
        self.callbacks.check_states(states)
        self.callbacks.fire("on_load_checkpoint", self, states)

    def close(self) -> None:
        """Drop the DDP wrapper (cures a gloo exit hang); end the process group if ours."""
        self.model = self.unwrapped_model
        self.train_batches.close()
        if self._owns_dist:
            self.dist.close(failed=self._failed)


class DistTrainer(Trainer):
    """`Trainer` on many processes (DDP, or FSDP2 by `strategy`): one process per device, from
    any launcher (torchrun, `--nproc` or `launch()`, srun, mpirun: `nlptrain.environments`);
    without one, one process. Each rank gets its share of the data from an injected
    `ShardedSampler` (a DistributedSampler, set_epoch every epoch), unless the user gave a
    DataLoader or sampler of their own, which is kept as is."""

    def __init__(self, model: torch.nn.Module, *args: Any, timeout: float | None = None,
                 **kwargs: Any) -> None:
        made_here = kwargs.get("dist") is None
        if made_here:
            kwargs["config"] = config = train_config(kwargs.get("config"))
            kwargs["dist"] = distributed.from_env(timeout or config.timeout)
        super().__init__(model, *args, **kwargs)
        self._owns_dist = made_here

