"""Workers for the strategy tests: train, evaluate, checkpoint and resume under DDP or FSDP2 on
real ranks (run through tests/ddp.py's run_ranks), returning whole weights and metrics."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from conftest import REPO, SHARED_DATA, write_toy_tsv
from nlptrain.callbacks import FGM, Checkpointer, Freeze, GradClip
from toy_trainer import model_without_dropout
from transformers import AutoTokenizer

from nlptrain import Callback, DistTrainer, TrainConfig, distributed
from nlptrain.checkpoint import checkpoint_name, load_checkpoint
from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset, build_datasets
from nlptrain.data.readers import read_examples
from nlptrain.errors import ConfigError
from nlptrain.models import load_model
from nlptrain.task_files import load_task

LABELS = ["neg", "pos"]


@functools.cache
def tokenizer_of(model_dir: str) -> Any:
    return AutoTokenizer.from_pretrained(model_dir)


def toy_set(folder: Path, model_dir: str, name: str, rows: int, seed: int) -> TokenizedDataset:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_of(model_dir)
    vocab = LabelVocab.from_config(LABELS)
    spec = FileSpec(path=str(write_toy_tsv(folder / f"{name}.tsv", rows, seed)))
    examples = read_examples(spec, folder, vocab.values)
    return TokenizedDataset.from_texts(examples.texts, vocab.encode(examples), tokenizer, 32)


def eval_set(folder: Path, model_dir: str) -> TokenizedDataset:
    """The shipped rt-polarity task's test split (1,067 rows, seeded) tokenized for the tiny
    model; where the real data is absent, 1,067 toy rows."""
    if not (SHARED_DATA / "rt-polarity").is_dir():
        return toy_set(folder, model_dir, "big", 1067, seed=3)
    task = load_task(REPO / "tasks" / "rt-polarity.toml")
    task.data_dir, task.model.name = str(SHARED_DATA), model_dir
    test = build_datasets(task, tokenizer_of(model_dir), use_cache=False).test
    assert len(test) == 1067
    return test


class RecordSteps(Callback):
    """Clipping norms and the weights at chosen steps (a collective under FSDP2: every rank)."""

    def __init__(self, at: tuple[int, ...] = ()) -> None:
        self.at, self.norms, self.weights = at, [], {}

    def on_step_end(self, trainer: Any) -> None:
        clips = trainer.callbacks.find(GradClip)
        self.norms.append(clips[0].last_norm if clips else None)
        if trainer.global_step in self.at:
            self.weights[trainer.global_step] = trainer.strategy.full_state_dict(trainer.model)


def make_trainer(dist: Any, model_dir: str, train: Any, test: Any, strategy: str,
                 callbacks: list, **config: Any) -> DistTrainer:
    torch.manual_seed(0)  # the same new head on every rank and in every run
    model = load_model(model_dir, LABELS)
    settings = {"epochs": 1, "batch_size": 4, "lr": 1e-3, "max_grad_norm": 0.05, "timeout": 60,
                "strategy": strategy, **config}
    return DistTrainer(model, train, test, config=TrainConfig(**settings), callbacks=callbacks,
                       dist=dist)


def equivalence_worker(rank: int, world: int, folder: str, model_dir: str, grad_accum: int,
                       eval_batch: int) -> dict:
    """DDP, then FSDP2, for 10 optimizer steps from the same start; then an FSDP2 evaluation of
    an untrained model on `eval_set`'s rows, whose shares take unequal batch counts."""
    dist = distributed.from_env(60)
    own = Path(folder) / f"rank{rank}"
    train = toy_set(own, model_dir, "train", 10 * 4 * world * grad_accum, seed=1)
    test = toy_set(own, model_dir, "test", 15, seed=2)
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        record = RecordSteps()
        trainer = make_trainer(dist, model_dir, train, test, strategy, [record],
                               grad_accum=grad_accum, eval_batch_size=4)
        trainer.fit()
        out[strategy] = {"params": trainer.strategy.full_state_dict(trainer.model),
                         "metrics": trainer.metrics, "norms": record.norms,
                         "steps": trainer.global_step, "kind": type(trainer.strategy).__name__}
        trainer.close()
    big = eval_set(own, model_dir)
    trainer = make_trainer(dist, model_dir, train, big, "fsdp", [], eval_batch_size=eval_batch)
    out["eval"] = trainer.evaluate(big)
    out["eval_batches"] = -(-len(range(rank, len(big), world)) // eval_batch)  # this rank's own
    trainer.close()
    dist.close()
    return out


def checkpoint_worker(rank: int, world: int, folder: str, model_dir: str, strategy: str,
                      train_rows: int, resume_from: str = "", record_at: int = 6,
                      ema_decay: float = 0.0, freeze: bool = False) -> dict:
    """Train 2 epochs with a checkpoint every 3 steps into FOLDER/<strategy>-<world>/; resume
    from `resume_from` (written by any world size), or else resume the run just made from its
    checkpoint at `record_at`. Whole weights (rank 0) come back: loaded, at `record_at`, final
    (with `ema_decay`, the average's, which EMA exports at the end). `freeze`: a gradual Freeze
    (a block more every 2 steps, the embeddings frozen throughout)."""
    dist = distributed.from_env(60)
    train = toy_set(Path(folder) / f"w{world}-rank{rank}", model_dir, "train", train_rows, seed=1)
    out: dict[str, Any] = {"kind": [], "steps": []}

    def run(resume: Path | None, record: RecordSteps) -> DistTrainer:
        saver = Checkpointer(Path(folder) / f"{strategy}-{world}", every=3, keep=0)
        frozen = [Freeze(2, "steps", gradual=True)] if freeze else []
        trainer = make_trainer(dist, model_dir, train, None, strategy, [*frozen, record, saver],
                               epochs=2, ema_decay=ema_decay)
        if resume is not None:
            load_checkpoint(trainer, resume)
            out.update(loaded=trainer.strategy.full_state_dict(trainer.model),
                       loaded_step=trainer.global_step)
        trainer.fit()
        out["kind"].append(type(trainer.strategy).__name__)
        out["steps"].append(trainer.global_step)
        return trainer

    record = RecordSteps(at=(record_at,))
    first = run(Path(resume_from) if resume_from else None, record)
    out.update(final=first.strategy.full_state_dict(first.model), at=record.weights)
    first.close()
    if not resume_from:  # the same world resumes its own run
        resumed = run(Path(folder) / f"{strategy}-{world}" / checkpoint_name(record_at),
                      RecordSteps())
        out["resumed_final"] = resumed.strategy.full_state_dict(resumed.model)
        resumed.close()
    dist.close()
    return out


def scale_worker(rank: int, world: int, folder: str, model_dir: str, written_by: str = "",
                 evaluate: bool = False) -> dict:
    """DDP then FSDP2: one short epoch with a checkpoint at step 2 into FOLDER/<strategy>-<world>/,
    or first a resume from `written_by`'s step-2 checkpoint; then (`evaluate`) `eval_set`."""
    dist = distributed.from_env(120)
    own = Path(folder) / f"w{world}-rank{rank}"
    train = toy_set(own, model_dir, "train", 48, seed=1)
    big = eval_set(own, model_dir) if evaluate else None
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        record = RecordSteps(at=(2,))
        saver = Checkpointer(Path(folder) / f"{strategy}-{world}", every=2, keep=0)
        trainer = make_trainer(dist, model_dir, train, None, strategy, [record, saver],
                               batch_size=2, eval_batch_size=13)
        got: dict[str, Any] = {"kind": type(trainer.strategy).__name__}
        if written_by:
            load_checkpoint(trainer, Path(written_by) / f"{strategy}-8" / checkpoint_name(2))
            got["loaded"] = trainer.strategy.full_state_dict(trainer.model)
        trainer.fit()
        got.update(steps=trainer.global_step, batches=trainer.batches_per_epoch, at=record.weights)
        if big is not None and strategy == "fsdp":
            got["eval"] = trainer.evaluate(big)
            got["final"] = trainer.strategy.full_state_dict(trainer.model)  # whole on rank 0
        trainer.close()
        out[strategy] = got
    dist.close()
    return out


def freeze_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    """DDP, then FSDP2, with the same gradual Freeze (a block more unfrozen every 2 steps, from
    the top): whole weights at the start and after each of the 6 steps; then FGM under FSDP2."""
    dist = distributed.from_env(60)
    train = toy_set(Path(folder) / f"rank{rank}", model_dir, "train", 6 * 4 * world, seed=1)
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        record = RecordSteps(at=tuple(range(1, 7)))
        trainer = make_trainer(dist, model_dir, train, None, strategy,
                               [Freeze(2, "steps", gradual=True), record])
        start = trainer.strategy.full_state_dict(trainer.model)
        trainer.fit()
        out[strategy] = {0: start, **record.weights, "kind": type(trainer.strategy).__name__}
        trainer.close()
    trainer = make_trainer(dist, model_dir, train, None, "fsdp", [FGM(1.0)])
    try:
        trainer.fit()
    except ConfigError as error:
        out["fgm"] = str(error)
    trainer.close()
    dist.close()
    return out


def unsharded_after_eval_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    """FSDP2 keeping the weights gathered after forward (reshard_after_forward false): the
    weights after an evaluation (sharded DTensors, or plain tensors left gathered), and a run
    with an evaluating EMA and an evaluation every 2 steps, which swaps weights after each."""
    from torch.distributed.tensor import DTensor

    dist = distributed.from_env(60)
    own = Path(folder) / f"rank{rank}"
    train, test = toy_set(own, model_dir, "train", 6 * 4 * world, 1), toy_set(own, model_dir, "test", 12, 2)
    trainer = make_trainer(dist, model_dir, train, test, "fsdp", [], reshard_after_forward=False,
                           ema_decay=0.9, eval_every=2)
    trainer.evaluate(test)
    sharded = all(isinstance(p, DTensor) for p in trainer.model.parameters())
    trainer.fit()
    out = {"sharded": sharded, "steps": trainer.global_step,
           "final": trainer.strategy.full_state_dict(trainer.model)}
    trainer.close()
    dist.close()
    return out


def compile_worker(rank: int, world: int, folder: str, model_dir: str, strategy: str,
                   compiled: bool) -> tuple[float, bool]:
    """One epoch of the toy task under `strategy`, eager or compiled, dropout off: the evaluation
    loss, and whether the model ran compiled."""
    dist = distributed.from_env(120)
    own = Path(folder) / f"rank{rank}"  # each rank writes its own copy of the toy files
    train, test = toy_set(own, model_dir, "train", 32, 1), toy_set(own, model_dir, "test", 16, 2)
    model = model_without_dropout(model_dir)
    config = TrainConfig(epochs=1, batch_size=4, lr=1e-3, strategy=strategy, compile=compiled,
                         precision="fp32", timeout=120)
    trainer = DistTrainer(model, train, test, config=config, dist=dist)
    try:
        return trainer.fit()["loss"], trainer.unwrapped_model._compiled_call_impl is not None
    finally:
        trainer.close()
