"""Test helpers: a toy trainer on the tiny BERT, its data sets, a callback recording every event,
and the outputs of a finished run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import write_toy_tsv
from safetensors.torch import load_file
from transformers import AutoTokenizer

from nlptrain import EVENTS, Callback, TrainConfig, Trainer
from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset
from nlptrain.data.readers import read_examples
from nlptrain.models import load_model


class Recorder(Callback):
    """Records every event by name, and what a callback can see of the trainer."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.seen: dict[str, object] = {}

    def peek(self, trainer) -> None:
        self.seen.update(model=trainer.model, optimizer=trainer.optimizer,
                         scheduler=trainer.scheduler, epoch=trainer.epoch,
                         global_step=trainer.global_step, steps_per_epoch=trainer.steps_per_epoch)


def _recording(event: str):
    def record(self, trainer, *args) -> None:
        self.events.append(event)
        if event == "on_step_end":
            self.peek(trainer)
    return record


for _event in EVENTS:
    setattr(Recorder, _event, _recording(_event))


def toy_datasets(tmp_path: Path, model_dir: Path, rows: int = 24, test_rows: int = 10):
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = LabelVocab.from_config(["neg", "pos"])
    out = []
    for name, n, seed in (("train", rows, 1), ("test", test_rows, 2)):
        examples = read_examples(FileSpec(path=str(write_toy_tsv(tmp_path / f"{name}.tsv", n, seed))),
                                 tmp_path, vocab.values)
        out.append(TokenizedDataset.from_texts(examples.texts, vocab.encode(examples), tokenizer, 32))
    return out


def model_without_dropout(model_dir: Path | str) -> torch.nn.Module:
    """The tiny BERT, seeded, with every dropout off: compiled dropout draws other random numbers
    than eager, so only runs without it can be compared number for number."""
    torch.manual_seed(0)
    model = load_model(str(model_dir), ["neg", "pos"])
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.config.attention_probs_dropout_prob = 0.0
    return model


def make_trainer(tmp_path, tiny_model_dir, callbacks, resume_from=None, **config):
    train, test = toy_datasets(tmp_path, tiny_model_dir)
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    settings = {"epochs": 2, "batch_size": 8, "lr": 1e-3, **config}
    return Trainer(model, train, test, config=TrainConfig(**settings), callbacks=callbacks,
                   resume_from=resume_from)


def assert_trained_as_the_whole_run(trainer: Trainer, tmp_path: Path, tiny_model_dir: Path,
                                    **config) -> None:
    """The trainer's weights equal, bit for bit, those of a run of `config` never stopped."""
    (tmp_path / "whole").mkdir()
    whole = make_trainer(tmp_path / "whole", tiny_model_dir, [], **config)
    whole.fit()
    expected = whole.unwrapped_model.state_dict()
    for name, value in trainer.unwrapped_model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model" / "model.safetensors")


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


class RaiseAfterStep(Callback):
    """A crash at the end of optimizer step `step`, once the callbacks before it have seen it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer) -> None:
        if trainer.is_update_step and trainer.global_step == self.step:
            raise RuntimeError(f"crash after step {self.step}")


def crash_then_resume(tmp_path: Path, tiny_model_dir: Path, callbacks, crash_after: int,
                      every: int, **config) -> Trainer:
    """A run of `callbacks()` (made anew for each run, writing the same files) that crashes after
    step `crash_after`, with a checkpoint every `every` steps, then resumed from the latest one."""
    from nlptrain.callbacks import Checkpointer

    from nlptrain.checkpoint import list_checkpoints, load_checkpoint

    folder = tmp_path / "checkpoints"
    crashing = make_trainer(tmp_path, tiny_model_dir, [*callbacks(), RaiseAfterStep(crash_after),
                                                       Checkpointer(folder, every)], **config)
    try:
        crashing.fit()
    except RuntimeError as error:
        assert str(error) == f"crash after step {crash_after}"
    resumed = make_trainer(tmp_path, tiny_model_dir, [*callbacks(), Checkpointer(folder, every)],
                           **config)
    load_checkpoint(resumed, list_checkpoints(folder)[-1])
    resumed.fit()
    return resumed


def best_run_args(toy_task: Path, run: Path, *extra: str) -> list[str]:
    """`train` with 40 of the 160 rows held out (15 steps an epoch), the best model by loss; the
    evaluations after BEST_STEP (env) are spoiled, so the best stays the one of BEST_STEP."""
    scaffold = Path(__file__).resolve().parent / "scaffold_callbacks.py"
    return ["train", "--task", str(toy_task), "--output-dir", str(run), "--valid-size", "0.25",
            "--metric-for-best", "loss", "--callback", f"{scaffold}:SpoilEvaluationsAfter", *extra]

