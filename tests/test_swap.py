"""A callback replaces the training data; the loop trains on exactly the new rows and recounts."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler
from toy_trainer import crash_then_resume, make_trainer, toy_datasets

from nlptrain import Callback


class Swap(Callback):
    """Swaps in `datasets[epoch]` at on_train_start (epoch 0) and on_epoch_start, and records
    (epoch, dataset id, row index) of every trained row."""

    def __init__(self, datasets, sequential: bool = False) -> None:
        self.datasets = datasets
        self.sequential = sequential
        self.trained: list[tuple[int, int, int]] = []
        self.current = None
        self.batches_per_epoch: list[int] = []

    def _swap(self, trainer) -> None:
        data = self.datasets[min(trainer.epoch, len(self.datasets) - 1)]
        self.current = data
        if self.sequential:
            trainer.train_data = DataLoader(data, batch_size=5, sampler=SequentialSampler(data),
                                            collate_fn=trainer.collate)
        else:
            trainer.train_data = data

    def on_train_start(self, trainer) -> None:
        self._swap(trainer)

    def on_epoch_start(self, trainer) -> None:
        self._swap(trainer)

    def on_batch_start(self, trainer, batch) -> None:
        if trainer.batch_in_epoch == 0:
            self.batches_per_epoch.append(trainer.batches_per_epoch)
        self.trained += [(trainer.epoch, id(self.current), int(i)) for i in batch["index"]]


def test_swap_in_on_train_start_trains_on_the_new_rows_only(tmp_path, tiny_model_dir):
    (tmp_path / "b").mkdir()
    other, _ = toy_datasets(tmp_path / "b", tiny_model_dir, rows=19)
    swap = Swap([other])
    trainer = make_trainer(tmp_path, tiny_model_dir, [swap], epochs=2, batch_size=4)
    original_rows = len(trainer.train_data)
    trainer.fit()
    assert original_rows == 24 and len(other) == 19
    for epoch in (0, 1):
        rows = sorted(i for e, d, i in swap.trained if e == epoch)
        assert rows == list(range(19))  # every row of the swapped set once, nothing else
        assert {d for e, d, _ in swap.trained if e == epoch} == {id(other)}
    # Steps and the lr schedule come from the swapped set: 19 rows / 4 = 5 batches an epoch.
    assert swap.batches_per_epoch == [5, 5]
    assert trainer.global_step == 10
    assert math.isclose(trainer.optimizer.param_groups[0]["lr"], 0.0, abs_tol=1e-12)  # decayed to 0


def test_swap_each_epoch_keeps_the_users_sampler_and_recounts(tmp_path, tiny_model_dir):
    sets = []
    for name, rows in (("a", 12), ("b", 23)):
        (tmp_path / name).mkdir()
        sets.append(toy_datasets(tmp_path / name, tiny_model_dir, rows=rows)[0])
    swap = Swap(sets, sequential=True)
    trainer = make_trainer(tmp_path, tiny_model_dir, [swap], epochs=2)
    trainer.fit()
    epoch0 = [(d, i) for e, d, i in swap.trained if e == 0]
    epoch1 = [(d, i) for e, d, i in swap.trained if e == 1]
    # The SequentialSampler was kept: rows in file order, no DistributedSampler shuffling.
    assert epoch0 == [(id(sets[0]), i) for i in range(12)]
    assert epoch1 == [(id(sets[1]), i) for i in range(23)]
    assert swap.batches_per_epoch == [3, 5]  # batch size 5 from the user's loader


class LrPerStep(Callback):
    """The lr each optimizer step used (read before the step), and checkpoint at `save_at`."""

    def __init__(self, save_at: int = 0, folder=None) -> None:
        self.lrs: dict[int, float] = {}
        self.save_at, self.folder = save_at, folder

    def on_batch_start(self, trainer, batch) -> None:
        self.lrs[trainer.global_step] = trainer.optimizer.param_groups[0]["lr"]

    def on_step_end(self, trainer) -> None:
        if self.save_at and trainer.global_step == self.save_at:
            from nlptrain.checkpoint import save_checkpoint

            save_checkpoint(trainer, self.folder)


def sets_of(tmp_path, tiny_model_dir, sizes):
    sets = []
    for name, rows in zip("ab", sizes, strict=True):
        (tmp_path / name).mkdir(exist_ok=True)
        sets.append(toy_datasets(tmp_path / name, tiny_model_dir, rows=rows)[0])
    return sets


def assert_linear_to_zero_from(lrs: dict[int, float], swap_step: int, end_step: int) -> None:
    """From the swap on, the lr falls in equal steps from where it was to 0 at the last step."""
    start = lrs[swap_step]
    for step in range(swap_step, end_step):
        expected = start * (end_step - step) / (end_step - swap_step)
        assert math.isclose(lrs[step], expected, rel_tol=1e-6), (step, lrs[step], expected)


def test_a_larger_set_swapped_in_at_epoch_2_stretches_the_schedule(tmp_path, tiny_model_dir):
    small, large = sets_of(tmp_path, tiny_model_dir, (10, 40))
    seen = LrPerStep()
    trainer = make_trainer(tmp_path, tiny_model_dir, [Swap([small, large]), seen], epochs=3,
                           batch_size=4)
    trainer.fit()
    assert trainer.global_step == 3 + 10 + 10  # planned from epoch 1 alone it was 9
    assert all(lr > 0 for step, lr in seen.lrs.items() if step > 0)  # never stuck at 0
    assert_linear_to_zero_from(seen.lrs, 3, 23)
    assert math.isclose(trainer.optimizer.param_groups[0]["lr"], 0.0, abs_tol=1e-12)


def test_a_smaller_set_swapped_in_at_epoch_2_still_decays_to_zero(tmp_path, tiny_model_dir):
    large, small = sets_of(tmp_path, tiny_model_dir, (40, 10))
    seen = LrPerStep()
    trainer = make_trainer(tmp_path, tiny_model_dir, [Swap([large, small]), seen], epochs=3,
                           batch_size=4)
    trainer.fit()
    assert trainer.global_step == 10 + 3 + 3  # planned from epoch 1 alone it was 30
    assert_linear_to_zero_from(seen.lrs, 10, 16)
    assert math.isclose(trainer.optimizer.param_groups[0]["lr"], 0.0, abs_tol=1e-12)


def test_a_replanned_schedule_resumes_exactly(tmp_path, tiny_model_dir):
    from nlptrain.checkpoint import load_checkpoint

    small, large = sets_of(tmp_path, tiny_model_dir, (10, 40))
    whole = LrPerStep(save_at=8, folder=tmp_path / "step-8")  # after the re-plan at step 3
    make_trainer(tmp_path, tiny_model_dir, [Swap([small, large]), whole], epochs=3,
                 batch_size=4).fit()
    resumed = LrPerStep()
    trainer = make_trainer(tmp_path, tiny_model_dir, [Swap([small, large]), resumed], epochs=3,
                           batch_size=4)
    load_checkpoint(trainer, tmp_path / "step-8")
    trainer.fit()
    assert sorted(resumed.lrs) == list(range(8, 23))
    assert resumed.lrs == {s: lr for s, lr in whole.lrs.items() if s >= 8}


def test_a_list_of_batches_swapped_in_is_trained_as_is(tmp_path, tiny_model_dir):
    """An iterable of ready batches (here a list, which has a length but no `dataset`)."""
    class SwapInBatches(Callback):
        def on_train_start(self, trainer) -> None:
            rows = [trainer.train_data[i] for i in range(20)]
            trainer.train_data = [trainer.collate(rows[i:i + 5]) for i in range(0, 20, 5)]

    trainer = make_trainer(tmp_path, tiny_model_dir, [SwapInBatches()], epochs=2)
    trainer.fit()
    assert trainer.global_step == 8 and trainer.steps_per_epoch == 4
    assert math.isclose(trainer.optimizer.param_groups[0]["lr"], 0.0, abs_tol=1e-12)


def test_fit_again_with_more_epochs_plans_the_ended_schedule_again_and_without_says_so(
        tmp_path, tiny_model_dir, caplog):
    """A second fit() trained nothing, unsaid; with more epochs it trained at lr 0 (the schedule
    had ended), where a resume with more epochs plans it again."""
    from dataclasses import replace

    record = LrPerStep()
    trainer = make_trainer(tmp_path, tiny_model_dir, [record], epochs=1, batch_size=8)
    trainer.fit()
    ended = trainer.global_step
    with caplog.at_level("WARNING", logger="nlptrain"):
        trainer.fit()
    assert trainer.global_step == ended and "has trained its 1 epoch(s) already" in caplog.text
    trainer.config = replace(trainer.config, epochs=3)
    trainer.fit()
    assert trainer.global_step == 3 * ended
    later = [lr for step, lr in record.lrs.items() if step > ended]
    assert len(later) == 2 * ended - 1 and min(later) > 1e-5, record.lrs


def test_a_generator_of_batches_read_up_is_an_error_not_a_spin_for_ever(tmp_path, tiny_model_dir):
    """With steps_per_epoch (the advice for data without a length), epoch 2 read the used-up
    generator again and again: 100% CPU for ever, and SIGTERM waited for a step that never came."""
    from nlptrain.errors import DataError

    class SwapInAGenerator(Callback):
        def on_train_start(self, trainer) -> None:
            rows = [trainer.train_data[i] for i in range(10)]
            trainer.train_data = (trainer.collate(rows[i:i + 5]) for i in range(0, 10, 5))

    trainer = make_trainer(tmp_path, tiny_model_dir, [SwapInAGenerator()], epochs=2,
                           steps_per_epoch=2)
    with pytest.raises(DataError, match="the training data gave no batch in a whole pass: a "
                                        "generator or iterator is read once"):
        trainer.fit()
    assert trainer.global_step == 2  # the first epoch trained


class UnseededLoader(Callback):
    """The README's CurriculumData, as users write it: a DataLoader made at each epoch's start
    with no generator, so creating its iterator draws a seed from the global RNG (and a shuffled
    one its order too)."""

    def __init__(self, shuffle: bool) -> None:
        self.shuffle = shuffle

    def on_epoch_start(self, trainer) -> None:
        data = trainer.train_data.dataset if isinstance(trainer.train_data, DataLoader) \
            else trainer.train_data
        trainer.train_data = DataLoader(data, batch_size=4, collate_fn=trainer.collate,
                                        **({"shuffle": True} if self.shuffle else
                                           {"sampler": SequentialSampler(data)}))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_users_unseeded_loader_resumed_mid_epoch_trains_the_weights_of_the_whole_run(
        tmp_path, tiny_model_dir, shuffle):
    """Resumed after step 9 (epoch 2, batch 3): the skipped batches are read in the random state
    the epoch began in, so the loader's seed and order, and the dropout after, are the first
    run's (before: the seed was drawn again from the checkpoint's state, shifting every later
    dropout mask)."""
    (tmp_path / "whole").mkdir()
    whole = make_trainer(tmp_path / "whole", tiny_model_dir, [UnseededLoader(shuffle)], epochs=2)
    whole.fit()
    resumed = crash_then_resume(tmp_path, tiny_model_dir, lambda: [UnseededLoader(shuffle)],
                                crash_after=10, every=9, epochs=2)
    assert resumed.global_step == whole.global_step == 12
    expected = whole.unwrapped_model.state_dict()
    for name, value in resumed.unwrapped_model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_a_loader_of_ones_own_that_every_rank_reads_whole_is_said(caplog):
    """A DataLoader of the user's is used as is (per-rank data is read that way); where its
    sampler is torch's Sequential or Random one, each rank reads every row: said on rank 0, for
    a user who forgot the DistributedSampler."""
    from torch.utils.data import DistributedSampler, RandomSampler

    from nlptrain.config import TrainConfig
    from nlptrain.loaders import check_own_loader

    rows = list(range(10))
    said = []
    for sampler, world in ((SequentialSampler(rows), 2), (RandomSampler(rows), 3),
                           (SequentialSampler(rows), 1),
                           (DistributedSampler(rows, num_replicas=2, rank=0), 2)):
        with caplog.at_level("INFO", logger="nlptrain.loaders"):
            caplog.clear()
            said.append(check_own_loader(DataLoader(rows, sampler=sampler), TrainConfig(), world,
                                         say=True))
        assert bool(caplog.records) == said[-1]
    assert said == [True, True, False, False]

    class OwnShards(torch.utils.data.BatchSampler):  # deals each rank its batches itself
        pass

    sharding_itself = OwnShards(RandomSampler(rows), batch_size=2, drop_last=False)
    assert not check_own_loader(DataLoader(rows, batch_sampler=sharding_itself), TrainConfig(), 2,
                                say=True)
    weighted = torch.utils.data.WeightedRandomSampler([1.0] * 10, 10)
    assert check_own_loader(DataLoader(rows, sampler=weighted), TrainConfig(), 2, say=True)
    assert check_own_loader(DataLoader(rows), TrainConfig(), 2, say=False) is False  # not rank 0
    caplog.clear()
    with caplog.at_level("INFO", logger="nlptrain.loaders"):
        check_own_loader(DataLoader(rows, shuffle=True), TrainConfig(), 3, say=True)
    assert "its RandomSampler does not shard by rank, so each of the 3 ranks reads all 10 of its " \
           "rows" in caplog.text
