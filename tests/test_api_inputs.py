"""What the Python API is given is checked where it is taken, not found wrong by torch after an
epoch's training: the inputs of an evaluation set of rows, rows longer than the model's
positions, targets of a user's own loader, label names where ids belong, a kind by its name,
and an evaluation set that differs by rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ddp import run_ranks
from numbered_rows import numbered_rows as rows
from transformers import AutoTokenizer

from nlptrain import TrainConfig, Trainer
from nlptrain.data import TokenizedDataset
from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds import MultiLabel, Regression
from nlptrain.models import load_model

CONFIG = TrainConfig(epochs=1, batch_size=2)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def pair_rows(tokenizer, count: int) -> TokenizedDataset:
    return TokenizedDataset.from_texts([f"text {i}" for i in range(count)], [i % 2 for i in range(count)],
                                       tokenizer, 16, pairs=[f"second {i}" for i in range(count)])


def as_list(data: TokenizedDataset) -> list[dict]:
    return [{k: v for k, v in data[i].items() if k != "index"} for i in range(len(data))]


def model(tiny_model_dir):
    return load_model(str(tiny_model_dir), ["neg", "pos"])


@pytest.mark.parametrize("train_pairs, eval_pairs, train_list, message", [
    (False, True, False, "the valid set holds text pairs, the train set single texts"),
    (True, False, False, "the valid set holds rows without token_type_ids, the train set text pairs"),
    (False, True, True, "the valid set holds text pairs, the train set rows without token_type_ids"),
])
def test_a_list_of_rows_of_other_inputs_than_the_train_sets_is_refused(
        tiny_model_dir, tokenizer, train_pairs, eval_pairs, train_list, message):
    """A list of rows had no `pairs`: pairs scored a model of single texts, without a word."""
    train = pair_rows(tokenizer, 6) if train_pairs else rows(tokenizer, [0, 1] * 3)
    valid = pair_rows(tokenizer, 4) if eval_pairs else rows(tokenizer, [0, 1] * 2)
    train, valid = (as_list(train) if train_list else train), (valid if train_list else as_list(valid))
    with pytest.raises(DataError, match=f"^{message}: the model would score other inputs"):
        Trainer(model(tiny_model_dir), train, valid, config=CONFIG, progress=False)


def test_a_list_of_rows_of_the_train_sets_inputs_is_taken(tiny_model_dir, tokenizer):
    for train, valid in ((pair_rows(tokenizer, 6), pair_rows(tokenizer, 3)),
                         (rows(tokenizer, [0, 1] * 3), rows(tokenizer, [0, 1, 1]))):
        trainer = Trainer(model(tiny_model_dir), train, as_list(valid), config=CONFIG, progress=False)
        assert trainer.fit()["rows"] == 3
        trainer.close()


def test_a_list_that_mixes_pairs_and_single_texts_is_refused(tiny_model_dir, tokenizer):
    """The collate read the first row's keys: a bare KeyError: 'token_type_ids'."""
    mixed = as_list(rows(tokenizer, [0, 1])) + as_list(pair_rows(tokenizer, 2))
    with pytest.raises(DataError, match=r"^valid data: row 2 of the list is a text pair \(type ids\), "
                                        r"row 0 has no token_type_ids: give rows of one kind"):
        Trainer(model(tiny_model_dir), pair_rows(tokenizer, 4), mixed, config=CONFIG, progress=False)


def test_rows_longer_than_the_models_positions_are_refused_before_training(tiny_model_dir, tokenizer):
    """An evaluation set tokenized to 256 tokens for a model of 128 positions failed in the
    model's forward pass after the whole epoch had trained."""
    long_texts = [" ".join(["word"] * 300), "short"]
    too_long = TokenizedDataset.from_texts(long_texts, [0, 1], tokenizer, 256)
    match = (r"^the valid set's row index 0 has 256 tokens, more than the model's 128 positions: "
             r"tokenize it with max_length at most 128$")
    with pytest.raises(DataError, match=match):
        Trainer(model(tiny_model_dir), rows(tokenizer, [0, 1] * 2), too_long, config=CONFIG,
                progress=False)
    trainer = Trainer(model(tiny_model_dir), rows(tokenizer, [0, 1] * 2), config=CONFIG, progress=False)
    with pytest.raises(DataError, match=r"^the eval set's row index 0 has 256 tokens"):
        trainer.evaluate(too_long)
    trainer.close()
    with pytest.raises(DataError, match=r"^the train set's row index 0 has 256 tokens"):
        Trainer(model(tiny_model_dir), too_long, config=CONFIG, progress=False)


def test_label_names_in_a_numpy_array_are_refused_as_a_list_of_them_is(tokenizer):
    names = np.array(["neg", "pos"])[[0, 1, 1]]  # numpy's UFuncTypeError 'less' before
    for labels in (names, list(names)):
        with pytest.raises(DataError, match=r"^the label at row index 0 is 'neg': give class ids"):
            TokenizedDataset.from_texts(["a", "b", "c"], labels, tokenizer, 16)


def test_label_names_in_a_list_of_rows_are_refused(tiny_model_dir, tokenizer):
    valid = [{**row, "labels": "pos"} for row in as_list(rows(tokenizer, [0, 1]))]
    with pytest.raises(DataError, match=r"^valid data: the label at row index 0 is 'pos': give class ids"):
        Trainer(model(tiny_model_dir), rows(tokenizer, [0, 1]), valid, config=CONFIG, progress=False)


def test_a_kind_by_its_name_is_that_kind(tiny_model_dir, tokenizer):
    """kind="regression" (a task file's spelling) failed: 'str' has no attribute 'problem_type'."""
    for name, kind in (("regression", Regression), ("multi-label", MultiLabel)):
        labels = [0.5, 1.5] if kind is Regression else [[1.0, 0.0], [0.0, 1.0]]
        names = ["neg", "pos"] if kind is MultiLabel else ["score"]
        trainer = Trainer(load_model(str(tiny_model_dir), names), rows(tokenizer, labels), kind=name,
                          config=CONFIG, progress=False)
        assert type(trainer.kind) is kind
        trainer.close()
    with pytest.raises(ConfigError, match=r"^kind='ordinal': no such kind; give one of single_label, "
                                          r"multi_label, regression"):
        Trainer(model(tiny_model_dir), rows(tokenizer, [0, 1]), kind="ordinal", config=CONFIG)


def test_a_pandas_frame_is_refused_with_the_way_to_a_dataset(tiny_model_dir):
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"text": ["a good film", "a bad one"], "label": [1, 0]})
    with pytest.raises(DataError, match=r"^train data is a pandas DataFrame: give "
                                        r"datasets\.Dataset\.from_pandas\(df\) and tokenizer="):
        Trainer(model(tiny_model_dir), frame, config=CONFIG, progress=False)


class Stream(torch.utils.data.IterableDataset):
    """A user's stream of tokenized rows, one with a class id the model does not have."""

    def __init__(self, rows: TokenizedDataset, bad_at: int, bad_label: int) -> None:
        self.rows, self.bad_at, self.bad_label = rows, bad_at, bad_label

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        for i in range(len(self.rows)):
            row = dict(self.rows[i])
            yield {**row, "labels": self.bad_label} if i == self.bad_at else row


def test_a_users_stream_with_a_class_id_past_the_labels_is_named_by_batch(tiny_model_dir, tokenizer):
    """It was torch's 'IndexError: Target 7 is out of bounds' (a device-side assert on a GPU)."""
    stream = Stream(rows(tokenizer, [0, 1] * 4), bad_at=5, bad_label=7)
    trainer = Trainer(model(tiny_model_dir), stream, config=CONFIG, progress=False)
    with pytest.raises(DataError, match=r"^training batch 3 of epoch 1: row index 1 has class id 7, "
                                        r"but the model has 2 labels \(neg, pos\): ids 0 to 1$"):
        trainer.fit()
    assert trainer.global_step == 2  # the batches before it trained
    trainer.close()


def _uneven_eval_worker(rank: int, world_size: int, model_dir: str) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    from nlptrain import DistTrainer

    trainer = DistTrainer(load_model(model_dir, ["neg", "pos"]), rows(tokenizer, [0, 1] * 4),
                          rows(tokenizer, [0, 1] * (2 + rank)), config=CONFIG, progress=False)
    try:
        trainer.evaluate(trainer.eval_data)
    except DataError as error:
        return f"{type(error).__name__} {error.raised_on_every_rank}: {error}"
    finally:
        trainer.close()
    return "scored"


@pytest.mark.distributed
def test_an_evaluation_set_that_differs_by_rank_is_said_before_scoring(tiny_model_dir, tmp_path):
    """Each rank scored its share of its own set, then: 'evaluation shards do not cover the set
    exactly once', and one rank aborted."""
    said = run_ranks(_uneven_eval_worker, 2, tmp_path, str(tiny_model_dir))
    assert said == ["DataError True: the evaluation set holds 4 rows on rank 0, 6 rows on rank 1: "
                    "give every rank the same evaluation set (each scores its share of it)"] * 2


def _stalled_rank_worker(rank: int, world_size: int, model_dir: str) -> str:
    import time

    from nlptrain import Callback, DistTrainer

    class StallOnRank1(Callback):
        def on_step_end(self, trainer) -> None:
            if trainer.dist.rank == 1 and trainer.global_step == 1:
                time.sleep(8)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = DistTrainer(load_model(model_dir, ["neg", "pos"]), rows(tokenizer, [0, 1] * 4),
                          config=TrainConfig(epochs=1, batch_size=2, timeout=3),
                          callbacks=[StallOnRank1()], progress=False)
    try:
        trainer.fit()
    except RuntimeError as error:
        return f"{type(error).__name__}: {error}"
    finally:
        trainer.close()
    return "trained"


@pytest.mark.distributed
def test_a_rank_that_stops_answering_is_one_line_from_the_python_api(tiny_model_dir, tmp_path):
    """The waiting rank raised gloo's traceback (as the CLI said it, in one line, before)."""
    said = run_ranks(_stalled_rank_worker, 2, tmp_path, str(tiny_model_dir))
    assert said[0].startswith("RanksTimedOut: no answer from the other rank(s) in time ("), said
    assert said[0].endswith("TrainConfig(timeout=SECONDS) sets how long ranks wait for each other")
    assert said[1].startswith(("PeerFailed: another rank failed", "RanksTimedOut")), said


def test_scores_in_a_numpy_object_array_stay_floats(tokenizer):
    """pandas' `.values` of mixed columns: an object array, cut to int64 (3.8 trained as 3)."""
    scores = np.array([0.5, 1.5, 3.8], dtype=object)
    found = TokenizedDataset.from_texts(["a", "b", "c"], scores, tokenizer, 16).labels
    assert found.dtype == np.float32 and found.tolist() == pytest.approx([0.5, 1.5, 3.8])


def batches_of(data: TokenizedDataset, labels: list, size: int = 2) -> list[dict]:
    """A user's ready-made batches, with targets of their own."""
    from nlptrain.data import Collator

    collate = Collator(0)
    rows = [data[i] for i in range(len(data))]
    found = [collate(rows[i:i + size]) for i in range(0, len(rows), size)]
    for i, batch in enumerate(found):
        batch["labels"] = torch.tensor(labels[i * size:(i + 1) * size])
    return found


def test_targets_the_loss_takes_pass_the_check_of_a_users_batches(tiny_model_dir, tokenizer):
    """The check refused cross-entropy's ignored rows (-100), soft targets and smoothed
    multi-label rows, and failed on bf16 scores (numpy has no bf16)."""
    data = rows(tokenizer, [0, 1, 1, 0])
    cases = [(["neg", "pos"], None, [0, -100, 1, 1]),
             (["neg", "pos"], MultiLabel(), [[0.9, 0.1], [0.1, 0.9]] * 2),
             (["score"], Regression(), torch.tensor([0.5, 1.5, 2.5, 3.5], dtype=torch.bfloat16).tolist())]
    for names, kind, labels in cases:
        trainer = Trainer(load_model(str(tiny_model_dir), names), batches_of(data, labels), kind=kind,
                          label_names=names, config=CONFIG, progress=False)
        assert trainer.fit()["step"] == 2
        trainer.close()
    soft = batches_of(data, [[0.7, 0.3]] * 4)  # class probabilities, for a loss of the user's
    trainer = Trainer(model(tiny_model_dir), soft, config=CONFIG, progress=False)
    trainer.loss_fn = lambda logits, targets: torch.nn.functional.cross_entropy(logits, targets)
    assert trainer.fit()["step"] == 2
    trainer.close()


def test_a_multi_label_target_past_1_and_a_users_loader_over_a_dataset_are_checked(tiny_model_dir,
                                                                                   tokenizer):
    data = rows(tokenizer, [0, 1, 1, 0])
    trainer = Trainer(model(tiny_model_dir), batches_of(data, [[1, 0], [0, 2]] * 2), kind=MultiLabel(),
                      config=CONFIG, progress=False)
    with pytest.raises(DataError, match=r"^training batch 1 of epoch 1: row index 1 has the targets "
                                        r"\[0\.0, 2\.0\]; a multi-label target is in \[0, 1\]"):
        trainer.fit()
    trainer.close()
    from nlptrain.data import Collator

    bad = rows(tokenizer, [0, 1, 7, 0])  # a DataLoader of the user's: the dataset was not checked
    loader = torch.utils.data.DataLoader(bad, batch_size=2, collate_fn=Collator(0))
    trainer = Trainer(model(tiny_model_dir), loader, config=CONFIG, progress=False)
    with pytest.raises(DataError, match=r"^training batch 2 of epoch 1: row index 0 has class id 7"):
        trainer.fit()
    trainer.close()


def test_single_texts_with_type_ids_of_their_own_are_single_texts(tiny_model_dir, tokenizer):
    """Funnel's and XLNet's CLS has type id 2: such single texts were refused as pairs; and a list
    where some rows carry all-zero type ids was refused as a mix of pairs and single texts."""
    from nlptrain.data.hf_datasets import RowList

    funnel = [{**row, "token_type_ids": [2] + [0] * (len(row["input_ids"]) - 1)}
              for row in as_list(rows(tokenizer, [0, 1]))]
    assert RowList(funnel).pairs is False
    some_zero = as_list(rows(tokenizer, [0, 1, 1]))
    some_zero[1] = {**some_zero[1], "token_type_ids": [0] * len(some_zero[1]["input_ids"])}
    trainer = Trainer(model(tiny_model_dir), rows(tokenizer, [0, 1] * 2), some_zero, config=CONFIG,
                      progress=False)
    assert trainer.fit()["rows"] == 3
    trainer.close()



@pytest.mark.parametrize("targets, kind, count, problem", [
    (torch.tensor([3, 7], dtype=torch.uint8), "single_label", 256, None),  # (7 >= 256 wrapped)
    (torch.tensor([[0], [1], [5], [0]]), "single_label", 2, "row index 2 has class id 5, but the model "
                                                          "has 2 labels"),  # the loss flattens it
    (torch.tensor([0, -100, 1]), "single_label", 2, None),
    (torch.tensor([-100, -100]), "single_label", 2, "every row's class id is -100 (ignored): the "
                                                    "loss has no row to learn from"),
    (torch.tensor([0.5, float("nan")]), "regression", 1, "row index 1 has the target(s) [nan], not "
                                                         "finite; drop the row or give it its target"),
    (torch.tensor([[float("nan"), 0.0]]), "multi_label", 2, "row index 0 has the target(s) [nan, 0.0], "
                                                           "not finite"),
    (torch.tensor([0.5, 1.5], dtype=torch.bfloat16), "regression", 1, None),
])
def test_what_a_users_batch_targets_are_refused_for(targets, kind, count, problem):
    from nlptrain.data.hf_datasets import batch_targets_problem
    from nlptrain.kinds import KINDS

    found = batch_targets_problem(targets, KINDS[kind](), [f"l{i}" for i in range(count)])
    assert found == problem if problem is None else found.startswith(problem), found


def test_a_callback_that_wraps_the_loss_keeps_the_check(tiny_model_dir, tokenizer):
    """RDrop replaces loss_fn and calls the kind's loss on the same targets: the check was off,
    and torch's IndexError came back."""
    from nlptrain.callbacks import RDrop

    data = rows(tokenizer, [0, 1, 1, 0])
    trainer = Trainer(model(tiny_model_dir), batches_of(data, [0, 1, 5, 0]), config=CONFIG,
                      callbacks=[RDrop()], progress=False)
    with pytest.raises(DataError, match=r"^training batch 2 of epoch 1: row index 0 has class id 5"):
        trainer.fit()
    trainer.close()
