"""The Python API's plain mistakes are one error naming the cure when the Trainer is built, not
a torch error inside the first step (or, for an empty set, a run that trains nothing)."""

from __future__ import annotations

import pytest
import torch
from numbered_rows import numbered_rows as rows
from transformers import AutoTokenizer

from nlptrain import TrainConfig, Trainer
from nlptrain.data import TokenizedDataset
from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds import SingleLabel
from nlptrain.models import load_model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.mark.parametrize("make_train, error, message", [
    (lambda tok: rows(tok, []), DataError, r"^the train set holds no rows$"),
    (lambda tok: ["good film", "bad film"], DataError,
     r"^train data is a list of texts: tokenize it first, with TokenizedDataset\.from_texts\("),
    (lambda tok: [{"input_ids": [5, 6]}], DataError,
     r"^train data: row 0 of the list has no labels; each row needs input_ids and labels$"),
    (lambda tok: [rows(tok, [0, 7])[i] for i in range(2)], DataError,
     r"^train data: row index 1 has class id 7, but the model has 2 labels"),
    (lambda tok: rows(tok, [0, 1, 5, 1]), DataError,
     r"^train data: row index 2 has class id 5, but the model has 2 labels \(neg, pos\): ids 0 "
     r"to 1$"),
    (lambda tok: rows(tok, [[1.0, 0.0, 1.0]] * 2), DataError,  # 0/1 rows, a single-label model
     r"^train data: its targets are 2-D \(\(2, 3\)\); a single-label task takes one class id a row$"),
    (lambda tok: rows(tok, [1.0, 0.0]), DataError,
     r"^train data: its class ids are floats \(1\.0, \.\.\.\); a single-label task takes ints"),
    (lambda tok: [{"text": "a good film", "label": 1}], DataError,
     r"^train data is a list of rows with the keys \['label', 'text'\], not yet tokenized: give "
     r"datasets\.Dataset\.from_list\(rows\) and tokenizer="),
    (lambda tok: (["a good film"], [1]), DataError, r"^train data is a tuple of 2 columns: or "
                                                    r"tokenize it \(TokenizedDataset\.from_texts"),
    (lambda tok: TokenizedDataset.from_texts(["fine", None], [0, 1], tok, 16, what="train"),
     DataError, r"^train: the text at row index 1 is None, not a text; drop the row or give it one$"),
])
def test_bad_train_data_is_refused_when_the_trainer_is_built(tiny_model_dir, tokenizer, make_train,
                                                            error, message):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(error, match=message):
        Trainer(model, make_train(tokenizer), config=TrainConfig(epochs=1))


def test_a_list_of_rows_trains_and_scores_as_the_dataset_they_came_from(tiny_model_dir, tokenizer):
    """A list of `TokenizedDataset` rows is a dataset (it was taken as ready-made batches, and
    the first step failed with "ndarray has no attribute to"): same batches, same weights."""
    import torch

    train, valid = rows(tokenizer, [0, 1, 1, 0] * 3), rows(tokenizer, [1, 0, 1])
    found = []
    for as_list in (False, True):
        torch.manual_seed(0)
        model = load_model(str(tiny_model_dir), ["neg", "pos"])
        given = [[data[i] for i in range(len(data))] if as_list else data for data in (train, valid)]
        trainer = Trainer(model, *given, config=TrainConfig(epochs=2, batch_size=4), progress=False)
        metrics = trainer.fit()
        found.append((trainer.global_step, metrics["loss"], next(model.parameters()).detach().clone()))
        trainer.close()
    assert found[0][:2] == found[1][:2] and torch.equal(found[0][2], found[1][2])


@pytest.mark.parametrize("config, message", [
    (TrainConfig(lr="3e-5"), r"^Trainer\(config=\.\.\.\): 'lr' must be float, got str '3e-5'$"),
    ({"epochs": 1, "learning_rate": 1e-4}, r"^Trainer\(config=\.\.\.\): unknown key "
                                           r"'learning_rate'\. Valid keys: epochs, "),
    ("epochs=1", r"^Trainer\(config=\.\.\.\): give a TrainConfig, or a dict of its keys, not str$"),
    (TrainConfig(grad_accum=0), r"^Trainer\(config=\.\.\.\): \[train\] grad_accum must be at least 1$"),
    ({"epochs": 0}, r"^Trainer\(config=\.\.\.\): \[train\] epochs must be at least 1$"),
    (TrainConfig(warmup_ratio=5), r"warmup_ratio must be in \[0, 1\]$"),
    (TrainConfig(padding="max_length"), r"^padding='max_length' pads to the task's max_length, "
                                        r"which a Trainer is not given: pass collate=Collator\("),
    # The fine-tuning keys, as a task file's: they were taken (-1 trained by gradient ascent).
    (TrainConfig(layer_lr_decay=-1.0), r"^Trainer\(config=\.\.\.\): \[train\] layer_lr_decay must "
                                       r"be in \(0, 1\]"),
    (TrainConfig(ema_decay=-0.5), r"\[train\] ema_decay must be in \[0, 1\)"),
    (TrainConfig(label_smoothing=1.5), r"\[train\] label_smoothing must be in \[0, 1\)"),
    (TrainConfig(class_weights=[-1.0, 2.0]), r"\[train\] class_weights = \[-1\.0, 2\.0\]: each "
                                             r"weight must be a number >= 0"),
])
def test_a_config_of_the_wrong_keys_or_types_is_refused_naming_the_key(tiny_model_dir, tokenizer,
                                                                      config, message):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(ConfigError, match=message):
        Trainer(model, rows(tokenizer, [0, 1]), config=config)


def test_a_config_given_as_a_dict_of_its_keys_is_taken(tiny_model_dir, tokenizer):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    trainer = Trainer(model, rows(tokenizer, [0, 1] * 4), config={"epochs": 2, "batch_size": 4})
    trainer.fit()
    assert (trainer.config.epochs, trainer.global_step) == (2, 4)


def test_an_evaluation_set_the_evaluation_cannot_shard_is_refused_before_training(
        tiny_model_dir, tokenizer):
    from torch.utils.data import DataLoader

    data = rows(tokenizer, [0, 1] * 4)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(DataError, match=r"^the evaluation set is a DataLoader: give a "
                                        r"TokenizedDataset"):
        Trainer(model, data, DataLoader(data, batch_size=4), config=TrainConfig(epochs=1))
    with pytest.raises(DataError, match=r"^the evaluation set holds no rows"):  # not "a list"
        Trainer(model, data, [], config=TrainConfig(epochs=1))


def test_resume_from_a_folder_of_other_files_is_refused_and_a_new_one_is_said(
        tiny_model_dir, tokenizer, tmp_path, caplog):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(Exception, match=r"holds no checkpoint but other files \(config\.json, "
                                        r"model\.safetensors.*\): resume_from takes a"):
        Trainer(model, rows(tokenizer, [0, 1]), resume_from=tiny_model_dir)
    (tmp_path / "model.safetensors").write_bytes(b"")  # a file: never a checkpoint
    with pytest.raises(Exception, match=r"model\.safetensors: a file; resume_from takes a "
                                        r"Checkpointer's folder or one step-N folder$"):
        Trainer(model, rows(tokenizer, [0, 1]), resume_from=tmp_path / "model.safetensors")
    with caplog.at_level("WARNING", logger="nlptrain"):
        Trainer(model, rows(tokenizer, [0, 1]), resume_from=tmp_path / "typo")
    assert "typo: no checkpoint yet (no such folder), training starts from the beginning" in \
        caplog.text
    # One step-N folder that is not there (pruned by keep_checkpoints, mistyped): not "damaged".
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    with pytest.raises(Exception, match=r"step-00000003: no such checkpoint; \S*checkpoints holds "
                                        r"step-00000004$"):
        Trainer(model, rows(tokenizer, [0, 1]), resume_from=tmp_path / "checkpoints" / "step-00000003")


@pytest.mark.parametrize("texts, labels, message", [
    (["a", "b", "c"], [0, 1], r"^data: 3 texts, 2 labels: give one of each a row$"),
    (["a", "b"], ["pos", "neg"], r"^the label at row index 0 is 'pos': give class ids \(0 to n-1"),
    (["a", "b"], [1.0, None], r"^the label at row index 1 is None: give class ids \(0 to n-1"),
    (["a", "b"], [[0, 2], [1]], r"^multi-label rows of unequal length: give each row a list of 0/1"),
])
def test_rows_that_do_not_line_up_with_their_labels_are_refused(tokenizer, texts, labels, message):
    with pytest.raises(DataError, match=message):
        TokenizedDataset.from_texts(texts, labels, tokenizer, 16)


def test_a_max_length_beyond_the_models_positions_is_refused_when_the_trainer_is_built(
        tiny_model_dir, tokenizer):
    from transformers import AutoConfig

    positions = AutoConfig.from_pretrained(tiny_model_dir).max_position_embeddings
    data = TokenizedDataset.from_texts(["a", "b"], [0, 1], tokenizer, positions + 8)
    with pytest.raises(ConfigError, match=rf"^the train data: max_length {positions + 8} is more "
                                          rf"than the model's {positions} positions"):
        Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data)


def test_a_kind_given_to_the_trainer_is_the_one_its_export_predicts_with(tiny_model_dir,
                                                                          tokenizer, tmp_path):
    # A model loaded for single labels, trained as multi-label: the saved config must say so,
    # else predict would score it with a softmax.
    from nlptrain.kinds import MultiLabel, from_model_config

    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    assert model.config.problem_type == "single_label_classification"
    trainer = Trainer(model, rows(tokenizer, [[1, 0], [1, 1]]), kind=MultiLabel(threshold=0.3),
                      config=TrainConfig(epochs=1, batch_size=2), progress=False)
    trainer.fit()
    trainer.strategy.export(trainer.model, tokenizer, tmp_path / "model")
    saved = type(model.config).from_pretrained(tmp_path / "model")
    assert saved.problem_type == "multi_label_classification"
    kind = from_model_config(saved)
    assert isinstance(kind, MultiLabel) and kind.threshold == 0.3


@pytest.mark.parametrize(("kind", "labels", "message"), [
    ("multi", [[1, 0, 1]] * 2, r"^train data: its rows have 3 label columns, the model 2 labels "
                               r"\(neg, pos\)$"),
    ("multi", [1, 0], r"^train data: its targets are 1-D \(\(2,\)\); a multi-label task takes "
                      r"a 0/1 row, one column a label$"),
    ("multi", [[1, 0], [1, -1]], r"^train data: row index 1 has the targets \[1(\.0)?, -1(\.0)?\]; a "
                                 r"multi-label task takes 0/1 rows"),  # a -1/+1 encoding
    ("regression", [0.5, float("nan")], r"^train data: row index 1 has the score nan, not a "
                                        r"finite number; drop the row or give it its score$"),
])
def test_targets_of_another_shape_than_the_kinds_are_refused_when_the_trainer_is_built(
        tiny_model_dir, tokenizer, kind, labels, message):
    from nlptrain.kinds import MultiLabel, Regression

    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    made = MultiLabel() if kind == "multi" else Regression()
    with pytest.raises(DataError, match=message):
        Trainer(model, rows(tokenizer, labels), config=TrainConfig(epochs=1), kind=made,
                label_names=["neg", "pos"])


def test_class_ids_of_any_integer_type_train_and_a_dataset_without_index_too(tiny_model_dir,
                                                                             tokenizer):
    """pandas' category codes are int8: cross-entropy refused them ("got Char") in the first
    step. A torch Dataset of {input_ids, labels} rows has no "index", which training needs not."""
    import numpy as np
    from torch.utils.data import Dataset

    codes = rows(tokenizer, np.array([0, 1, 1, 0], dtype=np.int8))

    class Plain(Dataset):
        def __len__(self) -> int:
            return len(codes)

        def __getitem__(self, i: int) -> dict:
            return {k: v for k, v in codes[i].items() if k != "index"}

    for data in (codes, Plain()):
        trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data,
                          config=TrainConfig(epochs=1, batch_size=2), progress=False)
        assert trainer.fit()["step"] == 2
        trainer.close()


def test_single_texts_to_score_a_model_of_pairs_are_refused(tiny_model_dir, tokenizer):
    """Validation then scored the first text alone, silently."""
    texts, labels = ["a cat sat", "a dog ran"], [0, 1]
    pairs = TokenizedDataset.from_texts(texts, labels, tokenizer, 16, pairs=["it sat", "it ran"])
    single = TokenizedDataset.from_texts(texts, labels, tokenizer, 16)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(DataError, match=r"^the valid set holds single texts, the train set text "
                                        r"pairs: the model would score other inputs"):
        Trainer(model, pairs, single, config=TrainConfig(epochs=1), progress=False)
    trainer = Trainer(model, pairs, pairs, config=TrainConfig(epochs=1), progress=False)
    with pytest.raises(DataError, match=r"^the eval set holds single texts, the train set text "):
        trainer.evaluate(single)
    trainer.close()


def test_a_users_dataset_with_a_pairs_attribute_of_its_own_is_not_compared(tiny_model_dir,
                                                                          tokenizer):
    """`pairs` of a user's Dataset may be its list of text pairs: a TypeError, not a check."""
    from nlptrain.data.hf_datasets import as_dataset

    single = TokenizedDataset.from_texts(["a", "b"], [0, 1], tokenizer, 16)

    class PairRows(torch.utils.data.Dataset):
        pairs = [("a", "b"), ("c", "d")]
        lengths = single.lengths
        labels = single.labels

        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> dict:
            return single[i]

    data = PairRows()
    assert as_dataset(data, tokenizer, ["neg", "pos"], SingleLabel(), "valid", like=single) is data


def test_a_fine_tuning_key_the_trainers_kind_cannot_take_is_refused(tiny_model_dir, tokenizer):
    from nlptrain.kinds import Regression

    model = load_model(str(tiny_model_dir), ["score"])
    with pytest.raises(ConfigError, match=r"^Trainer\(config=\.\.\.\): \[train\] label_smoothing is "
                                          r"for single_label tasks, not regression$"):
        Trainer(model, rows(tokenizer, [0.5, 0.1]), config=TrainConfig(label_smoothing=0.1),
                kind=Regression(), label_names=["score"])


def test_batches_without_what_the_loop_reads_are_named(tiny_model_dir, tokenizer):
    """A collate of the user's that dropped 'index' trained an epoch, then the evaluation failed
    with KeyError: 'index'; rows keyed 'label' (datasets' name) were a KeyError in a DataLoader;
    int32 class ids from a collate were torch's 'expected scalar type Long'."""
    from nlptrain.data import Collator

    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    data = rows(tokenizer, [0, 1] * 4)
    pad = Collator(0)

    def without_index(batch_rows):
        return {k: v for k, v in pad(batch_rows).items() if k != "index"}

    trainer = Trainer(model, data, data, config=TrainConfig(epochs=1, batch_size=4),
                      collate=without_index)
    with pytest.raises(DataError, match=r"^an evaluation batch holds no 'index' \(it holds "
                                        r"'input_ids', .*a collate of your own must keep them"):
        trainer.fit()
    assert trainer.global_step == 0  # said before training, not after an epoch of it

    from torch.utils.data import DataLoader  # torch's default collate: "stack expects each ..."

    with pytest.raises(DataError, match=r"^a DataLoader of your own over tokenized rows needs "
                                        r"collate_fn=trainer\.collate"):
        Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), DataLoader(data, batch_size=4),
                config=TrainConfig(epochs=1)).fit()

    def without_mask(batch_rows):  # a transformers model attended to the padding, unsaid
        return {k: v for k, v in pad(batch_rows).items() if k != "attention_mask"}

    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data,
                      config=TrainConfig(epochs=1, batch_size=4), collate=without_mask)
    with pytest.raises(DataError, match=r"^a training batch holds no 'attention_mask' \(it holds "
                                        r"'input_ids', "):
        trainer.fit()
    keyed_label = [{"input_ids": data[i]["input_ids"], "label": 0} for i in range(4)]
    with pytest.raises(DataError, match=r"^a row holds no 'labels' \(its keys: 'input_ids', "
                                        r"'label'\).*rename_column\('label', 'labels'\)"):
        pad(keyed_label)

    def int32_ids(batch_rows):
        return {**pad(batch_rows), "labels": torch.tensor([r["labels"] for r in batch_rows],
                                                          dtype=torch.int32)}

    trained = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data,
                      config=TrainConfig(epochs=1, batch_size=4), collate=int32_ids)
    trained.fit()
    assert trained.global_step == 2
    from transformers import BatchEncoding  # transformers' collators: a mapping, not a dict

    encoded = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data, data,
                      config=TrainConfig(epochs=1, batch_size=4),
                      collate=lambda batch_rows: BatchEncoding(pad(batch_rows)))
    assert "accuracy" in encoded.fit()


def accuracy_of(outputs, targets, label_names):
    return {"hits": float((outputs.argmax(-1) == targets).mean())}


@pytest.mark.parametrize("argument, message", [
    ({"kind": SingleLabel}, r"^kind=SingleLabel is a class: pass an instance, kind=SingleLabel\(\)$"),
    ({"metrics": accuracy_of}, r"^metrics= takes a list of functions: metrics=\[accuracy_of\]$"),
    ({"label_names": "neg,pos"}, r"^label_names= takes a list of names, not the string "
                                 r"'neg,pos': label_names=\['neg', 'pos'\]$")])
def test_an_argument_python_would_take_wrong_is_refused_with_the_cure(tiny_model_dir, tokenizer,
                                                                      argument, message):
    """They were a TypeError about TaskKind.check, 'function' object is not iterable, and a task
    of 7 one-character labels."""
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(ConfigError, match=message):
        Trainer(model, rows(tokenizer, [0, 1] * 4), config=TrainConfig(epochs=1), **argument)


def test_an_extra_backward_after_a_micro_batchs_backward_events_is_refused(tiny_model_dir, tokenizer):
    """trainer.backward() from on_batch_end: after the step's update its gradient stayed for the
    next step, weighed as that step's first micro-batch (or, inside a window, as the next one)."""
    from nlptrain import Callback
    from nlptrain.errors import TrainingError

    class ExtraPass(Callback):
        def __init__(self, event: str) -> None:
            self.event, self.passes = event, 0

        def pass_again(self, trainer) -> None:
            batch = trainer.batch
            trainer.backward(trainer.loss_fn(trainer.forward(batch), batch["labels"]))
            self.passes += 1

        def on_backward_end(self, trainer) -> None:
            if self.event == "on_backward_end":
                self.pass_again(trainer)

        def on_batch_end(self, trainer) -> None:
            if self.event == "on_batch_end":
                self.pass_again(trainer)

    data = rows(tokenizer, [0, 1] * 4)
    for event in ("on_backward_end", "on_batch_end"):
        extra = ExtraPass(event)
        trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data, callbacks=[extra],
                          config=TrainConfig(epochs=1, batch_size=4, grad_accum=2), progress=False)
        if event == "on_backward_end":
            trainer.fit()
            assert extra.passes == 2
        else:
            with pytest.raises(TrainingError, match=r"^trainer\.backward\(\) runs a micro-batch's "
                                                    r"passes: call it from on_batch_start to "
                                                    r"on_backward_end, not after them$"):
                trainer.fit()
            assert extra.passes == 0
        trainer.close()


def test_fine_tuning_callbacks_that_would_train_wrongly_are_refused_or_said(tiny_model_dir, tokenizer,
                                                                            caplog):
    """A negative FGM epsilon or R-Drop alpha trained the other way; two FGMs left a move in the
    weights; FGM under frozen embeddings (Freeze's gradual start) did nothing, unsaid."""
    from nlptrain.callbacks import FGM, Freeze, RDrop

    with pytest.raises(ConfigError, match=r"^FGM\(epsilon=-1\.0\): the step along the gradient must be > 0$"):
        FGM(-1.0)
    with pytest.raises(ConfigError, match=r"^RDrop\(alpha=-1\): the consistency term's weight must be > 0$"):
        RDrop(-1)
    data = rows(tokenizer, [0, 1] * 4)

    def trainer(*callbacks) -> Trainer:
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), data, callbacks=callbacks,
                       config=TrainConfig(epochs=1, batch_size=4), progress=False)

    twice = trainer(FGM(), FGM())
    with pytest.raises(ConfigError, match=r"^2 FGM callbacks: give one$"):
        twice.fit()
    twice.close()
    frozen = trainer(Freeze(1, "epochs", gradual=True), FGM())
    with caplog.at_level("WARNING", logger="nlptrain"):
        frozen.fit()
    assert caplog.text.count("FGM: the word embeddings are frozen (a Freeze, say), so there is no "
                             "adversarial pass until they train") == 1
    frozen.close()
