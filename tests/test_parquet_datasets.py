"""Data that already sits in Parquet or in a 🤗 `datasets.Dataset`: read like a TSV (same rows,
same token ids, same errors naming the file and row), trained on by Trainer and DistTrainer."""

from __future__ import annotations

import pytest
import torch
from conftest import write_toy_tsv
from ddp import run_ranks

from nlptrain import DistTrainer, TrainConfig, Trainer
from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset, read_examples
from nlptrain.data.hf_datasets import from_hf_dataset
from nlptrain.errors import DataError
from nlptrain.kinds import MultiLabel

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
hf_datasets = pytest.importorskip("datasets")
NAMES = ["neg", "pos"]


def toy_columns(tmp_path, rows, seed):
    examples = read_examples(FileSpec(path=str(write_toy_tsv(tmp_path / f"{seed}.tsv", rows, seed))),
                             "", [])
    return {"text": examples.texts, "label": examples.labels}


def tokenizer_of(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def test_parquet_file_reads_the_same_rows_and_tokens_as_the_tsv(tmp_path, tiny_model_dir):
    columns = toy_columns(tmp_path, 50, seed=1)
    pq.write_table(pa.table(columns), tmp_path / "train.parquet", row_group_size=16)
    from_tsv = read_examples(FileSpec(path="1.tsv"), tmp_path, [])
    from_parquet = read_examples(FileSpec(path="train.parquet"), tmp_path, [])
    assert from_parquet.texts == from_tsv.texts and from_parquet.labels == from_tsv.labels
    assert from_parquet.origin(49) == (str(tmp_path / "train.parquet"), 50)  # 1-based row
    tokenizer, vocab = tokenizer_of(tiny_model_dir), LabelVocab.from_config(NAMES)
    a, b = (TokenizedDataset.from_texts(e.texts, vocab.encode(e), tokenizer, 32)
            for e in (from_tsv, from_parquet))
    assert (a.ids == b.ids).all() and (a.offsets == b.offsets).all()


def test_parquet_list_column_is_a_multi_label_cell(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b", "c"], "tags": [["joy"], [], ["joy", "love"]]}),
                   tmp_path / "t.parquet")
    examples = read_examples(FileSpec(path="t.parquet", label_column="tags"), tmp_path, [])
    targets = MultiLabel().encode(examples.labels, {"joy": 0, "love": 1}, examples.origin)
    assert targets.tolist() == [[1, 0], [0, 0], [1, 1]]


def test_parquet_columns_to_keep_come_with_each_row_as_they_are(tmp_path):
    from nlptrain.data.readers import read_texts

    pq.write_table(pa.table({"id": [7, 9], "text": ["a", "b"]}), tmp_path / "t.parquet")
    assert read_texts(tmp_path / "t.parquet", keep=["id"]).kept == [{"id": 7}, {"id": 9}]
    with pytest.raises(DataError, match=r"no kept column 'ids' in the columns \['id', 'text'\]; "
                                        r"check --keep-columns"):
        read_texts(tmp_path / "t.parquet", keep=["ids"])


@pytest.mark.parametrize("table, spec, message", [
    ({"text": ["a"], "label": ["pos"]}, dict(label_column="stars"),
     "t.parquet: no label column 'stars' in the columns ['text', 'label']; set label_column"),
    ({"text": ["a", None], "label": ["pos", "neg"]}, {}, "t.parquet:2: the row has no text"),
    ({"text": ["a", "b"], "label": ["pos", None]}, {}, "t.parquet:2: the row has no label"),
])
def test_parquet_errors_name_the_file_and_row(tmp_path, table, spec, message):
    pq.write_table(pa.table(table), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_examples(FileSpec(path="t.parquet", **spec), tmp_path, [])


def test_binary_text_columns_are_read_as_text_and_duplicate_columns_refused(tmp_path):
    """Older Spark and Hive writers store strings as binary: str() trained on "b'good one'";
    a column named twice was pyarrow's KeyError traceback."""
    pq.write_table(pa.table({"text": pa.array([b"good one", b"bad one"], pa.binary()),
                             "label": pa.array([b"pos", b"neg"], pa.binary())}), tmp_path / "b.parquet")
    examples = read_examples(FileSpec(path="b.parquet"), tmp_path, [])
    assert (examples.texts, examples.labels) == (["good one", "bad one"], ["pos", "neg"])
    pq.write_table(pa.table([pa.array(["a"]), pa.array(["pos"]), pa.array(["neg"])],
                            names=["text", "label", "label"]), tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"d\.parquet: the file names 2 columns 'label'; rename"):
        read_examples(FileSpec(path="d.parquet"), tmp_path, [])


def test_a_damaged_parquet_file_is_named(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(DataError, match="t.parquet: not a readable Parquet file"):
        read_examples(FileSpec(path="t.parquet"), tmp_path, [])


def make_trainer(model_dir, train, test, dist=None, cls=Trainer):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(model_dir), num_labels=2, id2label=dict(enumerate(NAMES)))
    return cls(model, train, test, config=TrainConfig(epochs=1, batch_size=8, lr=1e-3),
               tokenizer=tokenizer_of(model_dir), dist=dist)


def test_a_datasets_dataset_trains_exactly_like_the_same_rows_from_a_file(tmp_path, tiny_model_dir):
    train, test = toy_columns(tmp_path, 64, seed=1), toy_columns(tmp_path, 24, seed=2)
    features = hf_datasets.Features({"text": hf_datasets.Value("string"),
                                     "label": hf_datasets.ClassLabel(names=NAMES)})
    given = {name: hf_datasets.Dataset.from_dict(rows, features=features)
             for name, rows in (("train", train), ("test", test))}
    from_dataset = make_trainer(tiny_model_dir, given["train"], given["test"])
    from_dataset.fit()
    tokenizer, vocab = tokenizer_of(tiny_model_dir), LabelVocab.from_config(NAMES)
    tokenized = [TokenizedDataset.from_texts(rows["text"], [vocab.ids()[v] for v in rows["label"]],
                                             tokenizer, 128) for rows in (train, test)]
    from_arrays = make_trainer(tiny_model_dir, *tokenized)
    from_arrays.fit()
    assert from_dataset.metrics["accuracy"] == from_arrays.metrics["accuracy"]
    for (name, a), b in zip(from_dataset.unwrapped_model.state_dict().items(),
                            from_arrays.unwrapped_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_datasets_dataset_errors_are_the_readers_errors(tiny_model_dir):
    tokenizer = tokenizer_of(tiny_model_dir)
    bad_label = hf_datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": ["pos", "neg", "meh"]})
    with pytest.raises(DataError, match="train dataset:3: label 'meh' is not one of"):
        from_hf_dataset(bad_label, tokenizer, NAMES)
    no_column = hf_datasets.Dataset.from_dict({"sentence": ["a"], "label": [1]})
    with pytest.raises(DataError, match=r"train dataset: no text column 'text' in the columns "
                                        r"\['sentence', 'label'\]; name it with text_column="):
        from_hf_dataset(no_column, tokenizer, NAMES)
    with pytest.raises(DataError, match="pass tokenizer="):
        from_hf_dataset(bad_label, None, NAMES)
    ids = from_hf_dataset(hf_datasets.Dataset.from_dict({"text": ["a", "b"], "label": [1, 0]}),
                          tokenizer, NAMES)
    assert ids.labels.tolist() == [1, 0]  # ids are accepted beside names


def test_names_that_look_like_ids_are_names_and_ints_are_ids(tiny_model_dir):
    """Star ratings "1".."5": the text "1" is the first label, the id 1 the second; neither is
    read as the other, whether the ids are plain ints or a ClassLabel's."""
    tokenizer, stars, texts = tokenizer_of(tiny_model_dir), ["1", "2", "3", "4", "5"], list("abcd")
    as_text = {"text": texts, "label": ["1", "2", "5", "4"]}
    as_ids = {"text": texts, "label": [0, 1, 4, 3]}
    classes = hf_datasets.Features({"text": hf_datasets.Value("string"),
                                    "label": hf_datasets.ClassLabel(names=stars)})
    for rows, features in ((as_text, None), (as_ids, None), (as_text, classes)):
        data = hf_datasets.Dataset.from_dict(rows, features=features)
        assert from_hf_dataset(data, tokenizer, stars).labels.tolist() == [0, 1, 4, 3]
    tags = hf_datasets.Dataset.from_dict({"text": ["a", "b"], "label": [["1", "5"], ["2"]]})
    assert from_hf_dataset(tags, tokenizer, stars, MultiLabel()).labels.tolist() == [
        [1, 0, 0, 0, 1], [0, 1, 0, 0, 0]]
    too_big = hf_datasets.Dataset.from_dict({"text": ["a", "b"], "label": [4, 5]})
    with pytest.raises(DataError, match=r"^train dataset:2: label id 5 is not an id of the labels "
                                        r"\['1', '2', '3', '4', '5'\] \(0 to 4\)$"):
        from_hf_dataset(too_big, tokenizer, stars)


def test_multi_label_rows_of_0_and_1_are_a_column_per_label_not_label_ids(tiny_model_dir,
                                                                          tmp_path):
    """[0, 1, 1] over three labels is "anger" and "fear" (as TokenizedDataset.from_texts takes
    it), not the ids 0 and 1; lists of ids stay ids, also as torch values."""
    tokenizer, names = tokenizer_of(tiny_model_dir), ["joy", "anger", "fear"]
    hot = [[0, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 1]]
    data = hf_datasets.Dataset.from_dict({"text": list("abcd"), "label": hot})
    assert from_hf_dataset(data, tokenizer, names, MultiLabel()).labels.tolist() == hot
    # Two labels, one a row: [1, 0] read as ids would give every row both labels.
    for two in ([[1, 0], [0, 1], [1, 0]], [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]):
        data = hf_datasets.Dataset.from_dict({"text": list("abc"), "label": two})
        assert from_hf_dataset(data, tokenizer, ["x", "y"], MultiLabel()).labels.tolist() == [
            [1, 0], [0, 1], [1, 0]]
    ids = hf_datasets.Dataset.from_dict({"text": list("ab"), "label": [[1, 2], [0]]})
    for form in (ids, ids.with_format("torch"), ids.with_format("numpy")):
        assert from_hf_dataset(form, tokenizer, names, MultiLabel()).labels.tolist() == [
            [0, 1, 1], [1, 0, 0]]
    one = hf_datasets.Dataset.from_dict({"text": list("ab"), "label": [1, 0]}).with_format("torch")
    assert from_hf_dataset(one, tokenizer, names).labels.tolist() == [1, 0]
    # A file's JSON list names labels: a 0/1 row there is refused, not read as labels "0", "1".
    rows = tmp_path / "hot.jsonl"
    rows.write_text('{"text": "a", "label": ["joy"]}\n{"text": "b", "label": [0, 1, 1]}\n')
    with pytest.raises(DataError, match=r"hot.jsonl:2: the label list names '1' more than once "
                                        r"\(\[0, 1, 1\]\); list the row's labels by name"):
        read_examples(FileSpec(path=str(rows)), tmp_path, [], empty_label_ok=True)


def _two_ranks(rank, world_size, model_dir, train_rows, test_rows):
    from pathlib import Path

    train, test = (hf_datasets.Dataset.from_dict(rows) for rows in (train_rows, test_rows))
    trainer = make_trainer(Path(model_dir), train, test, cls=DistTrainer)
    metrics = trainer.fit()
    trainer.close()
    return {"accuracy": metrics["accuracy"], "rows": metrics["rows"],
            "first_weight": trainer.unwrapped_model.classifier.weight[0, 0].item()}


@pytest.mark.distributed
def test_dist_trainer_takes_a_datasets_dataset(tmp_path, tiny_model_dir):
    rows = toy_columns(tmp_path, 64, seed=1), toy_columns(tmp_path, 24, seed=2)
    found = run_ranks(_two_ranks, 2, tmp_path, str(tiny_model_dir), *rows)
    assert found[0] == found[1]  # the same gathered metrics and weights on every rank
    assert found[0]["rows"] == 24  # the whole test set, no padding duplicates
