"""`max_tokens`: batches by a token budget, still one shuffled, length-grouped pass per epoch,
the same batch count on every rank, resumable at a global sample count with any world size; the
trainer's steps and lr schedule follow the real batch count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_toy_tsv

from nlptrain import TrainConfig, Trainer
from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset, read_examples
from nlptrain.errors import ConfigError
from nlptrain.samplers import TokenBudgetSampler

LENGTHS = np.random.default_rng(0).integers(3, 120, size=1001)


def ranks(world, lengths=LENGTHS, max_tokens=512, epoch=0, start=0):
    samplers = [TokenBudgetSampler(lengths, max_tokens, world, r, seed=7) for r in range(world)]
    for sampler in samplers:
        sampler.set_epoch(epoch, start)
    return [list(s) for s in samplers]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_one_pass_within_budget_and_equal_batch_counts(world):
    per_rank = ranks(world)
    rows = [row for batches in per_rank for batch in batches for row in batch]
    assert sorted(rows) == list(range(len(LENGTHS)))  # every row once, none repeated
    assert len({len(batches) for batches in per_rank}) == 1  # every rank takes as many steps
    for batches in per_rank:
        for batch in batches:
            assert len(batch) * LENGTHS[batch].max() <= 512 or len(batch) == 1
    sizes = [len(b) for b in per_rank[0]]
    assert max(sizes) > 3 * min(sizes)  # short rows come many to a batch, long ones few


def test_length_grouped_shuffled_by_epoch_and_seeded():
    first, again, other = ranks(1)[0], ranks(1)[0], ranks(1, epoch=1)[0]
    assert first == again and first != other
    spread = np.mean([np.ptp(LENGTHS[b]) for b in first if len(b) > 1])
    assert spread < 0.2 * np.ptp(LENGTHS)  # rows of a batch have similar lengths
    starts = [LENGTHS[b].max() for b in first[1:]]
    assert not (np.all(np.diff(starts) <= 0) or np.all(np.diff(starts) >= 0))  # batches shuffled


@pytest.mark.parametrize("world_before, world_after", [(2, 2), (2, 3), (3, 1)])
def test_resume_takes_each_remaining_row_once_with_any_world_size(world_before, world_after):
    done_steps = 5
    before = ranks(world_before)
    consumed = [row for batches in before for batch in batches[:done_steps] for row in batch]
    after = ranks(world_after, start=len(consumed))
    rest = [row for batches in after for batch in batches for row in batch]
    assert sorted(consumed + rest) == list(range(len(LENGTHS)))
    assert len({len(batches) for batches in after}) == 1


def test_the_trainer_steps_and_schedules_on_the_real_batch_count(tmp_path, tiny_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    examples = read_examples(FileSpec(path=str(write_toy_tsv(tmp_path / "t.tsv", 120))), "", [])
    train = TokenizedDataset.from_texts(examples.texts, LabelVocab.from_config(["neg", "pos"])
                                        .encode(examples), AutoTokenizer.from_pretrained(
                                            str(tiny_model_dir)), 32)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2)
    trainer = Trainer(model, train, config=TrainConfig(epochs=2, max_tokens=96, warmup_ratio=0))
    trainer.fit()
    # the budget counts the tokens the batches pad to: lengths rounded up to a multiple of 8
    padded = (np.asarray(train.lengths) + 7) // 8 * 8
    assert np.array_equal(trainer.collate.width(np.asarray(train.lengths)), padded)
    plan = TokenBudgetSampler(padded, 96, seed=42)
    expected = 0
    for epoch in range(2):
        plan.set_epoch(epoch)
        expected += len(plan)
    assert trainer.global_step == expected
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # the linear decay ended on the last step
    with pytest.raises(ConfigError, match="max_tokens needs a dataset that knows"):
        trainer = Trainer(model, [{"input_ids": [1], "labels": 0}], config=TrainConfig(max_tokens=96))
        trainer.train_batches.loader(torch.utils.data.TensorDataset(torch.zeros(3)), lambda data: data,
                                     trainer.config, trainer.collate)


def test_batched_data_is_refused_not_batched_by_rows_instead(tmp_path, tiny_model_dir):
    """A DataLoader (a user's, or PerRankData's per-rank files) has its own batch size: under
    max_tokens it was trained on as is, the budget silently ignored."""
    from toy_trainer import toy_datasets

    from nlptrain.data import Collator
    from nlptrain.models import load_model

    train, _ = toy_datasets(tmp_path, tiny_model_dir)
    loader = torch.utils.data.DataLoader(train, batch_size=8, collate_fn=Collator(0))
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), loader,
                      config=TrainConfig(epochs=1, max_tokens=96))
    with pytest.raises(ConfigError, match="max_tokens = 96 cannot batch this training data"):
        trainer.fit()
    assert trainer.global_step == 0


@pytest.mark.parametrize("data, named", [({"streaming": True}, "a stream"),
                                         ({"train_shards": "parts"}, "per-rank files")])
def test_the_cli_refuses_a_budget_it_cannot_apply_before_reading_data(data, named):
    from nlptrain.task_files import task_from_dict

    raw = {"name": "t", "data": {"train": "t.tsv", **data}, "train": {"max_tokens": 256}}
    with pytest.raises(ConfigError, match=f"t.toml: \\[train\\] max_tokens needs the train set in "
                                          f"memory; it cannot batch {named}"):
        task_from_dict(raw, "t.toml")  # validated as read: before any row is read or counted


@pytest.mark.parametrize("pad_to, max_tokens", [(None, 12), (32, 31)])
def test_a_budget_below_the_longest_row_is_refused(tmp_path, tiny_model_dir, pad_to, max_tokens):
    """Such a row made a batch of its own, over the budget (a budget of 1 trained every row, up
    to max_length tokens, alone): the budget bounds a step's memory, so it is refused, as
    fairseq refuses a row over its max_tokens."""
    from toy_trainer import toy_datasets

    from nlptrain.data import Collator
    from nlptrain.loaders import train_loader

    train, _ = toy_datasets(tmp_path, tiny_model_dir)
    longest = pad_to or int(train.lengths.max())
    assert max_tokens < longest
    with pytest.raises(ConfigError, match=f"max_tokens = {max_tokens} is less than the longest "
                                          f"training row \\({longest} tokens, as padded\\)") as said:
        train_loader(train, TrainConfig(max_tokens=max_tokens), 1, 0, Collator(0, pad_to),
                     torch.device("cpu"))
    # Padded to max_length, pad_to_multiple_of rounds nothing: not offered as a cure.
    assert ("pad_to_multiple_of" in str(said.value)) == (pad_to is None)
    loader = train_loader(train, TrainConfig(max_tokens=longest), 1, 0, Collator(0, pad_to),
                          torch.device("cpu"))
    assert sum(len(batch["labels"]) for batch in loader) == len(train)


@pytest.mark.parametrize("world, start", [(2, 0), (3, 0), (3, 149)])
def test_single_row_batches_that_cannot_be_dealt_evenly_repeat_rows_never_drop_them(world, start):
    """Rows as long as the budget come one to a batch: 151 of them (or the 2 a resume leaves)
    do not divide among the ranks, and the last ranks repeat the epoch's first rows."""
    lengths = np.full(151, 32)
    per_rank = ranks(world, lengths, max_tokens=32, start=start)
    assert len({len(batches) for batches in per_rank}) == 1
    rows = [row for batches in per_rank for batch in batches for row in batch]
    planned = [row for batch in TokenBudgetSampler(lengths, 32, seed=7).global_plan()
               for row in batch]
    assert set(planned[start:]) <= set(rows)  # every row left, none dropped
    assert len(rows) == -(-(151 - start) // world) * world  # as few repeats as can be,
    assert set(rows) <= set(planned[start:]) | set(planned[:world])  # of the epoch's first rows
