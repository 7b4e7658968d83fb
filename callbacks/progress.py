"""A tqdm progress bar on rank 0: steps, loss (averaged over ranks), lr, it/s."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from nlptrain.events import Callback


class ProgressBar(Callback):
    main_process_only = True

    def __init__(self, refresh_every: int = 5) -> None:
        self.refresh_every = refresh_every
        self.bar: Any = None

    def on_epoch_start(self, trainer: Any) -> None:
        self._close()

    def on_batch_start(self, trainer: Any, batch: dict) -> None:
        if self.bar is None:  # the batch count is known only now (data may have been swapped)
            self.bar = tqdm(total=trainer.batches_per_epoch, initial=trainer.batch_in_epoch,
                            desc=f"epoch {trainer.epoch + 1}/{trainer.config.epochs}",
                            unit="batch", dynamic_ncols=True, leave=True)

    def on_batch_end(self, trainer: Any) -> None:
        self.bar.update(1)
        if trainer.batch_in_epoch % self.refresh_every == 0:
            lr = trainer.optimizer.param_groups[0]["lr"]
            self.bar.set_postfix(loss=f"{trainer.last_loss:.4f}", lr=f"{lr:.2e}", refresh=False)

    def on_valid_end(self, trainer: Any, metrics: dict, is_best: bool) -> None:
        line = (f"eval at step {trainer.global_step}: {trainer.kind.summary(metrics)}"
                f"{'  (best so far)' if is_best else ''}")
        (self.bar.write if self.bar is not None else print)(line)

    def on_train_end(self, trainer: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
