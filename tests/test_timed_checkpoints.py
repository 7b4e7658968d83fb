"""Checkpoints by the clock (`[train] checkpoint_minutes`): the main rank's clock asks, the
request rides the step's agreed flags (no collective of its own), and every rank saves at the
step where the flags are read, so a hard crash loses at most that many minutes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp import run_ranks
from nlptrain.callbacks import Checkpointer
from toy_trainer import toy_datasets

from nlptrain import Callback, DistTrainer, TrainConfig
from nlptrain.checkpoint import step_folders
from nlptrain.models import load_model


class Minutes(Callback):
    """A clock that moves `per_step` minutes at each optimizer step (before the Checkpointer
    reads it: that one runs last)."""

    def __init__(self, per_step: float) -> None:
        self.per_step, self.seconds = per_step, 0.0

    def __call__(self) -> float:
        return self.seconds

    def on_step_end(self, trainer) -> None:
        self.seconds += 60 * self.per_step


class RecordingCheckpointer(Checkpointer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[int] = []

    def save(self, trainer) -> None:
        if trainer.global_step != self.last_saved_step:
            self.steps.append(trainer.global_step)
        super().save(trainer)


def timed_run(folder: Path, model_dir: Path, minutes: float, per_step: float,
              every: int = 0) -> list[int]:
    """One epoch of the toy task, 96 rows in batches of 4; the steps that were saved."""
    train, test = toy_datasets(folder, model_dir, rows=96)
    clock = Minutes(per_step)
    saver = RecordingCheckpointer(folder / "checkpoints", every=every, keep=0, every_minutes=minutes,
                                  clock=clock)
    torch.manual_seed(0)
    trainer = DistTrainer(load_model(str(model_dir), ["neg", "pos"]), train, test,
                          config=TrainConfig(epochs=1, batch_size=4, lr=1e-3, timeout=60),
                          callbacks=[clock, saver])
    trainer.fit()
    trainer.close()
    return saver.steps


@pytest.mark.parametrize("minutes, saved", [(3.0, [5, 10, 15, 20, 24]), (0.0, [24])])
def test_a_checkpoint_every_few_minutes_of_training(tmp_path, tiny_model_dir, minutes, saved):
    """A minute a step, a checkpoint every 3: asked after step 3 (3 minutes), carried by step
    4's flags, read at step 5 (the flags are read a step late), saved there; then again 5
    steps on, and at the epoch's end. Off (0), the epoch's end alone."""
    assert timed_run(tmp_path, tiny_model_dir, minutes, per_step=1.0) == saved
    assert [int(p.name.removeprefix("step-")) for p in step_folders(tmp_path / "checkpoints")] == saved


def test_a_save_made_while_the_clocks_request_was_in_flight_serves_it(tmp_path, tiny_model_dir):
    """Every 5 steps and every 4 minutes at a minute a step: the clock asks after step 4, but the
    step-5 checkpoint is written before its request is read (at step 6), so no second one."""
    assert timed_run(tmp_path, tiny_model_dir, 4.0, per_step=1.0, every=5) == [5, 10, 15, 20, 24]


def timed_worker(rank: int, world: int, folder: str, model_dir: str) -> list[int]:
    own = Path(folder) / f"rank{rank}"
    own.mkdir(exist_ok=True)
    # Rank 1's clock runs ten times as fast: were it asked, it would save at every step.
    return timed_run(own, Path(model_dir), minutes=3.0, per_step=1.0 if rank == 0 else 10.0)


@pytest.mark.distributed
def test_every_rank_saves_at_the_steps_the_main_ranks_clock_asks_for(tmp_path, tiny_model_dir):
    """48 rows a rank: 12 steps. Both ranks save at steps 5 and 10 (rank 0's clock) and at the
    epoch's end; a save that one rank alone made would leave the other in its collectives."""
    found = run_ranks(timed_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    assert found == [[5, 10, 12], [5, 10, 12]]


class AskOnRank1At(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer) -> None:
        if trainer.dist.rank == 1 and trainer.global_step == self.step:
            trainer.should_save = True


def asking_worker(rank: int, world: int, folder: str, model_dir: str) -> list[int]:
    own = Path(folder) / f"rank{rank}"
    own.mkdir(exist_ok=True)
    train, test = toy_datasets(own, Path(model_dir), rows=96)
    saver = RecordingCheckpointer(own / "checkpoints", keep=0)  # no cadence, no clock
    torch.manual_seed(0)
    trainer = DistTrainer(load_model(model_dir, ["neg", "pos"]), train, test,
                          config=TrainConfig(epochs=1, batch_size=4, lr=1e-3, timeout=60),
                          callbacks=[AskOnRank1At(3), saver])
    trainer.fit()
    trainer.close()
    return saver.steps


@pytest.mark.distributed
def test_a_save_asked_on_one_rank_is_made_by_every_rank_at_the_same_step(tmp_path, tiny_model_dir):
    """Rank 1 alone asks after step 3: step 4's flags carry it, step 5 reads them, and both
    ranks save there (then at the epoch's end, step 12)."""
    found = run_ranks(asking_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    assert found == [[5, 12], [5, 12]]
