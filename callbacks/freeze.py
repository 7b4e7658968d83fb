"""Freeze the encoder for a while, then unfreeze it at once or a layer at a time from the top.

How it holds under DDP: DDP registers the parameters that require grad when it wraps the model,
and changing `requires_grad` afterwards makes its reducer fail or wait for gradients that never
come. So this callback changes `requires_grad` only between optimizer steps, on every rank at the
same step (the schedule is a function of the step or epoch), and then wraps the model again
(`trainer.rewrap_model()`). Frozen parameters then get no gradient at all: the backward stops
above them, DDP does not all-reduce them, and AdamW skips them (no update, no weight decay), so
they stay bit-identical. The optimizer holds every parameter from the start; its state for a
frozen one simply waits. A parameter frozen before training (by your code) stays frozen: this
callback unfreezes only what it froze, and leaves what your code changes during training as it is.

The schedule comes from the step (or epoch) alone, so a resume from any checkpoint freezes the
same blocks again; the count frozen is also saved in checkpoints, for the record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nlptrain.events import Callback
from nlptrain.optim import encoder_layout

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class Freeze(Callback):
    """The embeddings and encoder layers frozen for the first `until` steps or epochs (`unit`).

    `gradual=False`: all unfrozen together after `until`. `gradual=True`: after every `until`
    steps/epochs one more block is unfrozen from the top (the top layer first, the embeddings
    last); the head (classifier, pooler) always trains.
    """

    def __init__(self, until: int, unit: str = "epochs", gradual: bool = False) -> None:
        if unit not in ("steps", "epochs") or until < 1:
            raise ValueError("Freeze(until >= 1, unit='steps' | 'epochs')")
        self.until, self.unit, self.gradual = until, unit, gradual
        self.frozen = -1  # blocks frozen now, counted from the bottom (-1: not applied yet)
        self.frozen_here: set[int] = set()  # ids of the parameters this callback froze

    def frozen_blocks(self, done: int, blocks: int) -> int:
        """How many blocks (from the embeddings up) are frozen after `done` steps or epochs."""
        if not self.gradual:
            return blocks if done < self.until else 0
        return max(blocks - done // self.until, 0)

    def apply(self, trainer: Trainer) -> None:
        blocks = encoder_layout(trainer.unwrapped_model).blocks()
        done = trainer.global_step if self.unit == "steps" else trainer.epoch
        frozen = self.frozen_blocks(done, len(blocks))
        if frozen == self.frozen:
            return
        for index, block in enumerate(blocks):
            for param in block:
                if index < frozen and param.requires_grad and id(param) not in self.frozen_here:
                    # frozen here, to unfreeze later (one frozen here that your code unfroze
                    # since stays unfrozen)
                    param.requires_grad_(False)
                    param.grad = None
                    self.frozen_here.add(id(param))
                elif index >= frozen and id(param) in self.frozen_here:
                    param.requires_grad_(True)
                    self.frozen_here.discard(id(param))
        self.frozen = frozen
        trainer.rewrap_model()  # every rank at this same step: DDP registers the new set

    # Between steps only: gradients are zeroed, no backward is under way.
    def on_train_start(self, trainer: Trainer) -> None:
        self.apply(trainer)

    def on_epoch_start(self, trainer: Trainer) -> None:
        self.apply(trainer)

    def on_step_end(self, trainer: Trainer) -> None:
        if self.unit == "steps":
            self.apply(trainer)

    def on_train_end(self, trainer: Trainer) -> None:
        for param in trainer.unwrapped_model.parameters():  # what this callback froze, and no more
            if id(param) in self.frozen_here:
                param.requires_grad_(True)
        self.frozen_here.clear()
        self.frozen = -1

    def on_save_checkpoint(self, trainer: Trainer, state: dict[str, Any]) -> None:
        state["freeze"] = {"frozen_blocks": self.frozen}
