"""Dynamic padding rounds a batch's length up to a multiple of `pad_to_multiple_of` (8 by
default), never past max_length for that rounding and never below the longest row; a Trainer's
own collator takes both from its config and model; padding changes no real token's output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nlptrain import TrainConfig, Trainer
from nlptrain.data import Collator
from nlptrain.errors import ConfigError
from nlptrain.models import load_model, usable_positions
from nlptrain.task_files import train_config


def rows(*lengths: int) -> list[dict]:
    return [{"input_ids": list(range(1, n + 1)), "labels": 0, "index": i}
            for i, n in enumerate(lengths)]


@pytest.mark.parametrize(("multiple", "limit", "lengths", "width"), [
    (1, None, (3, 5), 5),        # the longest row exactly
    (8, None, (3, 5), 8),
    (8, None, (9, 2), 16),
    (8, None, (16,), 16),        # already a multiple: no more
    (8, 12, (9,), 12),           # rounded, but not past max_length
    (8, 12, (13,), 13),          # and never below the longest row
])
def test_a_batch_pads_to_the_next_multiple_within_max_length(multiple, limit, lengths, width):
    collate = Collator(7, multiple=multiple, limit=limit)
    batch = collate(rows(*lengths))
    assert batch["input_ids"].shape == (len(lengths), width)
    assert collate.width(max(lengths)) == width
    for i, n in enumerate(lengths):  # the padding is pad ids, masked out
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (width - n)
        assert batch["input_ids"][i, n:].eq(7).all()
    widths = collate.width(np.asarray(lengths))  # the token budget's view: each row's batch
    assert widths.tolist() == [int(collate.width(n)) for n in lengths]


def test_max_length_padding_ignores_the_multiple():
    assert Collator(0, pad_to=30, multiple=8)(rows(3))["input_ids"].shape == (1, 30)


def test_a_trainer_pads_to_its_configs_multiple_within_the_models_positions(tiny_model_dir):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    for multiple in (8, 1):
        trainer = Trainer(model, rows(3, 5), config=TrainConfig(pad_to_multiple_of=multiple),
                          progress=False)
        assert (trainer.collate.multiple, trainer.collate.limit) == (multiple, usable_positions(model))
        trainer.close()
    with pytest.raises(ConfigError, match="pad_to_multiple_of must be at least 1"):
        train_config({"pad_to_multiple_of": 0})


def test_a_users_own_model_without_a_config_rounds_within_its_encoders_positions(tiny_model_dir):
    """A head of the user's own around a BertModel has no `config` of its own: the limit is read
    from its position embeddings (128 here), so a batch of 125-token rows pads to 128, not to
    144, the next multiple of 48 (past the table: an IndexError in the forward)."""
    from own_model import MeanPoolClassifier

    model = MeanPoolClassifier(tiny_model_dir, 2)
    assert not hasattr(model, "config") and usable_positions(model) == 128
    trainer = Trainer(model, rows(125, 3), config=TrainConfig(pad_to_multiple_of=48),
                      label_names=["neg", "pos"], progress=False)
    assert trainer.collate.limit == 128
    assert trainer.collate(rows(125, 3))["input_ids"].shape == (2, 128)
    trainer.close()
    assert usable_positions(torch.nn.Linear(2, 2)) is None  # no position table: no limit known


def test_padding_to_a_multiple_changes_no_real_tokens_output(tiny_model_dir):
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), ["neg", "pos"]).eval()
    batch = rows(5, 3)
    with torch.no_grad():
        exact = model(**{k: v for k, v in Collator(0)(batch).items()
                         if k in ("input_ids", "attention_mask")}).logits
        padded = model(**{k: v for k, v in Collator(0, multiple=8)(batch).items()
                          if k in ("input_ids", "attention_mask")}).logits
    torch.testing.assert_close(padded, exact)


def test_padding_to_max_length_is_the_collate_given(tiny_model_dir):
    """padding='max_length' was padded as dynamic; with a Collator, its pad_to is every width."""
    from transformers import AutoTokenizer

    from nlptrain import Callback
    from nlptrain.data import TokenizedDataset

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    texts = TokenizedDataset.from_texts([f"text {i}" for i in range(8)], [0, 1] * 4, tokenizer, 16)

    class Widths(Callback):
        seen: list[int] = []

        def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
            self.seen.append(batch["input_ids"].shape[1])

    Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), texts,
            config=TrainConfig(padding="max_length", epochs=1, batch_size=4),
            collate=Collator(0, pad_to=16), callbacks=[Widths()]).fit()
    assert Widths.seen == [16, 16]


def test_label_names_in_a_users_rows_are_one_error_naming_the_cure():
    """A Dataset of the user's that gives "pos" for a label: numpy's "invalid literal for int()"
    from deep in the collate, before (review 122)."""
    from nlptrain.errors import DataError

    rows = [{"input_ids": [1, 2], "labels": 0}, {"input_ids": [1], "labels": "pos"}]
    with pytest.raises(DataError, match=r"^in a batch of your dataset's rows, the label at row "
                                        r"index 1 is 'pos': give class ids"):
        Collator(0)(rows)
