"""Shared pieces of the fine-tuning technique tests: toy data, the tiny model, recorders."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import write_toy_tsv
from transformers import AutoTokenizer

from nlptrain import Callback
from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset
from nlptrain.data.readers import read_examples
from nlptrain.models import load_model


def toy_sets(folder: Path, model_dir: Path, rows: int = 24, test_rows: int = 8):
    """Train and test TokenizedDatasets of the two-class toy rows, tokenized for the tiny model."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = LabelVocab.from_config(["neg", "pos"])
    out = []
    for name, n, seed in (("train", rows, 1), ("test", test_rows, 2)):
        spec = FileSpec(path=str(write_toy_tsv(folder / f"{name}.tsv", n, seed)))
        examples = read_examples(spec, folder, vocab.values)
        out.append(TokenizedDataset.from_texts(examples.texts, vocab.encode(examples), tokenizer, 32))
    return out


def tiny_model(model_dir: Path, dropout: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    model = load_model(str(model_dir), ["neg", "pos"])
    if not dropout:  # for comparisons with a hand-written step: no random masks
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


class RecordSteps(Callback):
    """The weights after every optimizer step (and at the start), and the gradients at each
    update step's on_backward_end (complete there)."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_train_start(self, trainer) -> None:
        if not self.weights:
            self.weights.append(snapshot(trainer.unwrapped_model))

    def on_backward_end(self, trainer) -> None:
        if trainer.is_update_step:
            self.grads.append({k: p.grad.detach().clone()
                               for k, p in trainer.unwrapped_model.named_parameters()
                               if p.grad is not None})

    def on_step_end(self, trainer) -> None:
        self.weights.append(snapshot(trainer.unwrapped_model))


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def hand_ema(weights: list[dict[str, torch.Tensor]], decay: float) -> dict[str, torch.Tensor]:
    """The EMA by its definition, over the weights at the start and after each step."""
    average = {k: v.float().clone() for k, v in weights[0].items()}
    for step in weights[1:]:
        for k in average:
            average[k] = decay * average[k] + (1 - decay) * step[k].float()
    return average
