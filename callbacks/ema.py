"""An exponential moving average (EMA) of the weights, kept on every rank, evaluated and exported.

After each optimizer step: `average = decay * average + (1 - decay) * weights` (float32, for
every floating-point parameter). Under DDP the weights are identical on every rank after each
step, so every rank computes the same average with no communication; nothing is kept on rank 0
alone, and evaluation (which runs on every rank) sees the same averaged model everywhere.

- `evaluate=True`: the averaged weights are swapped in from on_valid_start to on_valid_end, so
  the metrics, `is_best` and `best/` (SaveBestModel, which must come before this callback in the
  list, as it does in `nlptrain train`) are those of the average; the training weights come back
  after.
- `export=True`: at the end of training the averaged weights replace the trained ones, so the
  final test metrics and `model/` are the average's. The trained weights are kept too (one copy
  of them): a `fit()` that goes on (after a stop, or with more epochs) trains on from them.
- The average is saved in checkpoints (whole, also under FSDP2, where each rank averages its
  own shard) and a resume continues it exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from nlptrain.errors import ConfigError
from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class EMA(Callback):
    def __init__(self, decay: float = 0.999, evaluate: bool = True, export: bool = True) -> None:
        if not 0 <= decay < 1:
            raise ValueError("EMA decay must be in [0, 1)")
        self.decay, self.evaluate, self.export = decay, evaluate, export
        self.average: dict[str, torch.Tensor] | None = None
        self.step = -1  # the optimizer step the average includes
        self._kept: dict[str, torch.Tensor] | None = None  # training weights while swapped out
        self._trained: dict[str, torch.Tensor] | None = None  # ... under an exported average

    @staticmethod
    def averaged(trainer: Trainer) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in trainer.unwrapped_model.named_parameters()
                if p.is_floating_point()}

    @torch.no_grad()
    def update(self, trainer: Trainer) -> None:
        """Fold this step's weights into the average (once per step, whoever asks first)."""
        if self.step == trainer.global_step:
            return
        params = self.averaged(trainer)
        average = [self.average[name] for name in params]
        torch._foreach_mul_(average, self.decay)
        torch._foreach_add_(average, [p.float() for p in params.values()], alpha=1 - self.decay)
        self.step = trainer.global_step

    @torch.no_grad()
    def swap_in(self, trainer: Trainer) -> None:
        params = self.averaged(trainer)
        self._kept = {name: p.detach().clone() for name, p in params.items()}
        for name, param in params.items():
            param.copy_(self.average[name])

    @torch.no_grad()
    def swap_out(self, trainer: Trainer) -> None:
        for name, param in self.averaged(trainer).items():
            param.copy_(self._kept[name])
        self._kept = None

    def on_train_start(self, trainer: Trainer) -> None:
        from nlptrain.callbacks.best_model import SaveBestModel

        if self._trained is not None:  # a fit that goes on: from the weights trained, not the average
            self._kept, self._trained = self._trained, None
            self.swap_out(trainer)

        order = trainer.callbacks.callbacks
        later = order[next(i for i, c in enumerate(order) if c is self) + 1:]
        if self.evaluate and any(isinstance(c, SaveBestModel) for c in later):
            # It would see the training weights back, and save them under the average's metrics.
            raise ConfigError("SaveBestModel comes after EMA(evaluate=True) in the callbacks: put "
                              "SaveBestModel before EMA, so that best/ holds the average evaluated")
        evaluating = [c for c in order if isinstance(c, EMA) and c.evaluate]
        if self.evaluate and len(evaluating) > 1:
            # Each swaps its average in and out around an evaluation: the second swapped the
            # first's average back as the weights trained on.
            raise ConfigError(f"{len(evaluating)} EMA callbacks evaluate their average "
                              f"({', '.join(type(c).__name__ for c in evaluating)}): keep one, or "
                              "give the others evaluate=False")
        if self.average is None:  # else loaded from a checkpoint
            self.average = {name: p.detach().float().clone()
                            for name, p in self.averaged(trainer).items()}
            self.step = trainer.global_step

    def on_step_end(self, trainer: Trainer) -> None:
        self.update(trainer)

    def on_valid_start(self, trainer: Trainer) -> None:
        if self.evaluate and self.average is not None:
            self.update(trainer)
            self.swap_in(trainer)

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        if self._kept is not None:
            self.swap_out(trainer)

    def on_train_end(self, trainer: Trainer) -> None:
        if self._kept is not None:  # an error inside evaluation: put the training weights back
            self.swap_out(trainer)
        if self.export and self.average is not None:
            self.update(trainer)
            # A fit() may go on (after a stop, or with more epochs): it takes the trained
            # weights back (on_train_start), and trains on from them, not from the average.
            self.swap_in(trainer)
            self._trained, self._kept = self._kept, None

    def on_save_checkpoint(self, trainer: Trainer, state: dict[str, Any]) -> None:
        # A checkpoint written at on_step_end before this callback's turn still holds this step.
        # Whole tensors: under FSDP2 each rank holds a shard of the average (gathered here, on
        # every rank), and rank 0 alone writes the callbacks' state.
        if self.average is not None:
            self.update(trainer)
            whole = {name: trainer.strategy.whole(t) for name, t in self.average.items()}
            state["ema"] = {"decay": self.decay, "step": self.step, "average": whole}

    def on_load_checkpoint(self, trainer: Trainer, state: dict[str, Any]) -> None:
        saved = state.get("ema")
        if saved is not None:
            params = self.averaged(trainer)
            self.average = {name: trainer.strategy.held_like(t, params[name])
                            for name, t in saved["average"].items()}
            self.step = int(saved["step"])
