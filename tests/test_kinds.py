"""Task kinds: reading pairs, multi-label and regression targets; their losses, metrics and
directions; pairs encoded as real pairs with the same inputs in training and evaluation."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from kinds_data import write_multi_label_tsv, write_pairs, write_scores

from nlptrain.config import DataConfig, FileSpec, TaskConfig
from nlptrain.data import Collator, LabelVocab, TokenizedDataset, read_examples
from nlptrain.errors import ConfigError, DataError
from nlptrain.evaluate import model_inputs
from nlptrain.kinds import MultiLabel, Regression, SingleLabel, from_task
from nlptrain.task_files import task_from_dict


def test_pair_columns_in_tsv_csv_jsonl(tmp_path):
    write_pairs(tmp_path / "p.tsv", 5)
    tsv = read_examples(FileSpec(path="p.tsv", text_column="premise",
                                 text_pair_column="hypothesis"), tmp_path, [])
    (tmp_path / "p.csv").write_text('a,b,label\n"x, one","y ""two""",same\n')
    csv = read_examples(FileSpec(path="p.csv", text_column="a", text_pair_column="b"), tmp_path, [])
    (tmp_path / "p.jsonl").write_text(json.dumps({"q": "who?", "a": "me", "label": 1}) + "\n")
    jsonl = read_examples(FileSpec(path="p.jsonl", text_column="q", text_pair_column="a"),
                          tmp_path, [])
    assert len(tsv) == 5 and tsv.pairs[0].startswith("it felt") and tsv.texts[0].startswith("row 0")
    assert (csv.texts, csv.pairs, csv.labels) == (["x, one"], ['y "two"'], ["same"])
    assert (jsonl.texts, jsonl.pairs, jsonl.labels) == (["who?"], ["me"], ["1"])


def test_empty_pair_side_names_the_line(tmp_path):
    (tmp_path / "p.tsv").write_text("a\tb\tlabel\nfine\tok\tx\nfine\t \tx\n")
    with pytest.raises(DataError, match=r"p.tsv:3: the row has no second text"):
        read_examples(FileSpec(path="p.tsv", text_column="a", text_pair_column="b"), tmp_path, [])


def test_multi_label_targets_from_a_json_list_and_a_separated_cell(tmp_path):
    kind = MultiLabel(separator="|")
    write_multi_label_tsv(tmp_path / "m.tsv", 20, separator="|")
    spec = FileSpec(path="m.tsv", label_column="tags")
    with pytest.raises(DataError, match=r"m.tsv:\d+: the row has no label"):  # one label a row
        read_examples(spec, tmp_path, [], empty_label_ok=SingleLabel.empty_label_ok)
    examples = read_examples(spec, tmp_path, [], empty_label_ok=kind.empty_label_ok)
    vocab = LabelVocab.for_kind(kind, examples.labels, [])
    targets = vocab.encode(examples, kind)
    assert vocab.names == ["food", "music", "sport"]
    assert targets.shape == (len(examples), 3) and targets.dtype == np.float32
    assert [] in examples.labels  # an empty cell: a row with none of the labels
    for cell, row in zip(examples.labels, targets, strict=True):
        assert sorted(kind.label_values(cell)) == [vocab.names[i] for i in np.flatnonzero(row)]
    (tmp_path / "m.jsonl").write_text('{"text": "a", "tags": ["music", "food"]}\n'
                                      '{"text": "b", "tags": []}\n')
    rows = read_examples(FileSpec(path="m.jsonl", label_column="tags"), tmp_path, [])
    assert vocab.encode(rows, kind).tolist() == [[1, 1, 0], [0, 0, 0]]
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "tags": ["music"]}\n'
                                        '{"text": "b", "tags": ["food", "jazz"]}\n')
    bad = read_examples(FileSpec(path="bad.jsonl", label_column="tags"), tmp_path, [])
    with pytest.raises(DataError, match=r"bad.jsonl:2: label 'jazz' \(in \['food', 'jazz'\]\) "
                                        r"is not one of the task's labels .*label_names= in Python"):
        vocab.encode(bad, kind)


@pytest.mark.parametrize(("cell", "said"), [
    ("music,,food", r"the labels 'music,,food' hold an empty one \(a separator ',' at an end or "
                    r"twice in a row\); list the row's labels as 'a,b', or leave the cell empty"),
    ("music,", r"the labels 'music,' hold an empty one"),
    (",", r"the labels ',' hold an empty one"),  # read as none of the labels
    ("food,food", r"the labels 'food,food' name 'food' twice"),
    ("food,0", r"the labels 'food,0' name 'food' and '0', one label, twice"),
])
def test_a_multi_label_cell_that_drops_or_repeats_a_label_names_its_line(tmp_path, cell, said):
    """Each of these read as fewer labels, or none, without a word (a JSON list named twice was
    refused already)."""
    (tmp_path / "m.tsv").write_text(f"text\ttags\na\tmusic\nb\t{cell}\nc\t\n")
    (tmp_path / "s.tsv").write_text("text\ttags\na\tmusic  food\n")
    rows = read_examples(FileSpec(path="m.tsv", label_column="tags"), tmp_path, [],
                         empty_label_ok=True)
    vocab = LabelVocab.from_config({"0": "food", "1": "music"})
    with pytest.raises(DataError, match=r"m\.tsv:3: " + said):
        vocab.encode(rows, MultiLabel())
    spaced = read_examples(FileSpec(path="s.tsv", label_column="tags"), tmp_path, [])  # a run of
    assert vocab.encode(spaced, MultiLabel(" ")).tolist() == [[1, 1]]  # the separator is one


def test_a_label_list_in_a_single_label_task_says_so(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"text": "a", "label": "neg"}\n'
                                      '{"text": "b", "label": ["neg"]}\n')
    rows = read_examples(FileSpec(path="l.jsonl"), tmp_path, [])
    vocab = LabelVocab.for_kind(SingleLabel(), rows.labels, [])  # labels from the rows: neg
    with pytest.raises(DataError, match=r"l.jsonl:2: a list of labels \['neg'\], but the task is "
                                        r"single_label \(one label a row\); give one label, or set "
                                        r"\[data\] kind = \"multi_label\""):
        vocab.encode(rows, SingleLabel())


def test_regression_targets_are_floats_and_a_bad_score_names_the_line(tmp_path):
    write_scores(tmp_path / "s.tsv", 6)
    spec = FileSpec(path="s.tsv", text_column="first", text_pair_column="second",
                    label_column="score")
    examples = read_examples(spec, tmp_path, [])
    targets = LabelVocab(["score"], ["score"]).encode(examples, Regression())
    assert targets.dtype == np.float32
    assert np.allclose(targets, [float(v) for v in examples.labels])
    lines = (tmp_path / "s.tsv").read_text().splitlines()
    lines[4] = lines[4].rsplit("\t", 1)[0] + "\thigh"
    (tmp_path / "s.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"s.tsv:5: score 'high' is not a number"):
        LabelVocab(["score"], ["score"]).encode(read_examples(spec, tmp_path, []), Regression())
    lines[4] = lines[4].rsplit("\t", 1)[0] + "\t3_5"  # Python's float() would read 35
    (tmp_path / "s.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"s.tsv:5: score '3_5' is not a number"):
        LabelVocab(["score"], ["score"]).encode(read_examples(spec, tmp_path, []), Regression())
    for cell, said in [("1e39", "is beyond float32's range"),  # a number, but inf in float32
                       ("-1e400", "is beyond float32's range"),  # (inf in float64 too)
                       ("inf", "is not a number"), ("-Infinity", "is not a number")]:
        lines[4] = lines[4].rsplit("\t", 1)[0] + f"\t{cell}"
        (tmp_path / "s.tsv").write_text("\n".join(lines) + "\n")
        with pytest.raises(DataError, match=f"s.tsv:5: score '{cell}' {said}"):
            LabelVocab(["score"], ["score"]).encode(read_examples(spec, tmp_path, []), Regression())


def test_pairs_are_encoded_as_real_pairs_with_type_ids(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    texts, pairs = ["a short premise", "another one here"], ["the hypothesis", "yes"]
    dataset = TokenizedDataset.from_texts(texts, [0, 1], tokenizer, 32, pairs=pairs)
    batch = Collator(tokenizer.pad_token_id)([dataset[0], dataset[1]])
    expected = tokenizer(texts, pairs, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], expected["input_ids"])
    assert torch.equal(batch["token_type_ids"], expected["token_type_ids"])
    assert torch.equal(batch["attention_mask"], expected["attention_mask"])
    # Training and evaluation hand the model the same inputs: the type ids too.
    assert set(model_inputs(batch)) == {"input_ids", "attention_mask", "token_type_ids"}
    # The longer side is truncated first, never the pair dropped.
    long = TokenizedDataset.from_texts(["word " * 50], [0], tokenizer, 16, pairs=["short pair"])
    item = long[0]
    assert len(item["input_ids"]) == 16 and item["token_type_ids"][-4:].tolist() == [0, 1, 1, 1]


def test_single_label_adds_matthews_and_binary_f1():
    from sklearn.metrics import f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 2, 200)
    probs = rng.random((200, 2)).astype(np.float32)
    probs /= probs.sum(1, keepdims=True)
    found = SingleLabel().metrics(probs, truth, ["no", "yes"])
    guess = probs.argmax(1)
    assert found["mcc"] == pytest.approx(matthews_corrcoef(truth, guess))
    assert found["f1"] == pytest.approx(f1_score(truth, guess))
    assert "f1" not in SingleLabel().metrics(np.eye(3)[[0, 1, 2]], np.array([0, 1, 1]),
                                             ["a", "b", "c"])


def test_macro_f1_leaves_out_a_class_the_set_lacks_and_no_row_is_given():
    probs = np.eye(3)[[0, 1, 1, 0]]  # every row right; no row is, or is predicted, 'c'
    found = SingleLabel().metrics(probs, np.array([0, 1, 1, 0]), ["a", "b", "c"])
    assert found["accuracy"] == 1.0 and found["macro_f1"] == 1.0
    assert found["per_class"]["c"]["support"] == 0  # the table still lists every label


def test_multi_label_with_one_label_scores_that_label():
    truth = np.array([[0], [1], [0], [0]], dtype=np.float32)
    never = MultiLabel().metrics(np.full((4, 1), 0.1), truth, ["spam"])  # never says 'spam'
    assert never["micro_f1"] == never["macro_f1"] == 0.0
    assert never["per_class"]["spam"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert never["label_confusion"] == [[[3, 0], [1, 0]]]
    right = MultiLabel().metrics(truth * 0.8 + 0.1, truth, ["spam"])
    assert right["micro_f1"] == right["macro_f1"] == right["subset_accuracy"] == 1.0


def test_multi_label_metrics_at_the_threshold():
    from sklearn.metrics import f1_score

    truth = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=np.float32)
    probs = np.array([[0.9, 0.2, 0.6], [0.1, 0.4, 0.1], [0.8, 0.7, 0.3], [0.2, 0.1, 0.35]])
    at_half = MultiLabel(threshold=0.5).metrics(probs, truth, ["a", "b", "c"])
    guess = (probs >= 0.5).astype(int)
    assert at_half["subset_accuracy"] == 0.75  # row 2 misses 'b'
    assert at_half["micro_f1"] == pytest.approx(f1_score(truth, guess, average="micro"))
    assert at_half["macro_f1"] == pytest.approx(f1_score(truth, guess, average="macro"))
    assert at_half["per_class"]["b"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3),
                                         "support": 2}
    at_third = MultiLabel(threshold=0.3).metrics(probs, truth, ["a", "b", "c"])
    assert at_third["subset_accuracy"] == 0.5  # 'b' found in row 2, 'c' wrongly in row 4
    # A label no row has and none is given ('d') is left out of the macro mean, as single-label
    # leaves out an absent class: perfect on the others is a macro-F1 of 1, not 0.75.
    perfect = MultiLabel(threshold=0.5).metrics(truth[:3, :2], truth[:3, :2], ["a", "b"])
    padded = np.hstack([truth[:3, :2], np.zeros((3, 1), dtype=np.float32)])
    assert MultiLabel(threshold=0.5).metrics(padded, padded, ["a", "b", "d"])["macro_f1"] == \
        perfect["macro_f1"] == 1.0


def test_regression_metrics_and_directions():
    from scipy.stats import pearsonr, spearmanr

    truth = np.array([0.0, 1.0, 2.5, 4.0, 5.0], dtype=np.float32)
    guess = np.array([[0.5], [1.0], [2.0], [4.5], [4.0]], dtype=np.float32)
    found = Regression().metrics(guess, truth, ["score"])
    assert found["pearson"] == pytest.approx(pearsonr(truth, guess[:, 0]).statistic)
    assert found["spearman"] == pytest.approx(spearmanr(truth, guess[:, 0]).statistic)
    assert found["mse"] == pytest.approx(np.mean((truth - guess[:, 0]) ** 2))
    assert found["mae"] == pytest.approx(np.mean(np.abs(truth - guess[:, 0])))
    kind = Regression()
    assert kind.is_better("mse", 0.1, 0.2) and not kind.is_better("mse", 0.3, 0.2)
    assert kind.is_better("pearson", 0.9, 0.8) and kind.is_better("loss", 1.0, 2.0)
    assert kind.is_better("pearson", -0.5, None)


def test_an_undefined_correlation_is_nan_and_never_the_better_score():
    """A constant prediction (a collapsed head, bf16's rounding) reported 0, which beat every
    negative correlation: the collapsed model became the best. NaN, as scipy says."""
    truth = np.array([0.0, 1.0, 2.5, 4.0], dtype=np.float32)
    found = Regression().metrics(np.full((4, 1), 0.25, dtype=np.float32), truth, ["score"])
    assert np.isnan(found["pearson"]) and np.isnan(found["spearman"])
    assert found["mse"] == pytest.approx(np.mean((truth - 0.25) ** 2))
    assert not Regression().is_better("pearson", found["pearson"], -0.98)
    # Nor the first score: a collapsed model evaluated first became best/, early stopping's
    # patience never ran out, and the report named it "best on validation".
    assert not Regression().is_better("pearson", found["pearson"], None)
    assert Regression().is_better("pearson", -0.98, math.nan)
    from nlptrain.scores import strict_json  # results.json, eval --json: null, not NaN

    assert json.loads(json.dumps(strict_json(found)), parse_constant=pytest.fail)["pearson"] is None
    # A non-finite prediction: its scores are undefined (scikit-learn raised "Input contains NaN").
    broken = Regression().metrics(np.array([[1.0], [np.nan], [3.0], [2.0]]), truth, ["score"])
    assert all(np.isnan(broken[key]) for key in ("pearson", "spearman", "mse", "mae", "loss"))


def test_an_undefined_score_reads_n_a_in_the_report_and_the_model_card():
    """results.json holds it as null: the report showed Python's None, the model card left the
    metric out (its "every metric of results.json")."""
    from nlptrain.model_card import metrics_table
    from nlptrain.report import metrics_text

    results = {"valid": {"rows": 40, "pearson": None, "mse": 0.25},
               "test": {"rows": 40, "pearson": math.nan, "mse": 0.5}}
    assert metrics_table(results)[2:] == ["| pearson | n/a | n/a |", "| mse | 0.2500 | 0.5000 |"]
    assert metrics_text(results["valid"]) == "rows 40  Pearson n/a  MSE 0.2500"


def test_the_model_card_of_a_pair_model_shows_pairs_also_when_a_file_names_the_pair_column(
        tmp_path):
    """The pair column named in a file's own table, not [data]'s: the card said "a single-label
    model" and showed a single text, which a pair model scores without an error, wrongly."""
    import json

    from nlptrain.model_card import model_card

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(
        {"model_type": "bert", "nlptrain_text_pair": True, "id2label": {"0": "no", "1": "yes"}}))
    task = {"name": "t", "data": {"train": {"path": "t.tsv", "text_pair_column": "hypothesis"}}}
    (tmp_path / "config.json").write_text(json.dumps({"task": task}))
    card = model_card(tmp_path)
    assert "A single-label model of sentence pairs." in card
    assert '"text_pair": "second sentence"' in card


def test_a_regression_loss_keeps_its_targets_in_float32_under_bf16():
    """Cast to the bf16 logits' type, 3.8 trained as 3.796875."""
    logits = torch.tensor([[3.0], [4.0]], dtype=torch.bfloat16)
    targets = torch.tensor([3.8, 4.6])
    assert Regression().loss(logits, targets).item() == pytest.approx(((0.8 ** 2) + 0.6 ** 2) / 2)


def test_losses_match_transformers_problem_types():
    from torch import nn

    logits = torch.randn(4, 3)
    classes = torch.tensor([0, 2, 1, 2])
    hot = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], dtype=torch.float32)
    score = torch.randn(4)
    assert torch.equal(SingleLabel().loss(logits, classes), nn.CrossEntropyLoss()(logits, classes))
    assert torch.equal(MultiLabel().loss(logits, hot), nn.BCEWithLogitsLoss()(logits, hot))
    assert torch.equal(Regression().loss(logits[:, :1], score),
                       nn.MSELoss()(logits[:, :1].squeeze(), score.squeeze()))


def test_task_files_choose_the_kind_and_check_metric_for_best():
    task = task_from_dict({"data": {"kind": "multi_label", "label_separator": ";",
                                    "threshold": 0.3}}, "t.toml")
    kind = from_task(task)
    assert isinstance(kind, MultiLabel) and (kind.separator, kind.threshold) == (";", 0.3)
    assert isinstance(from_task(TaskConfig(data=DataConfig(kind="regression"))), Regression)
    with pytest.raises(ConfigError, match=r"metric_for_best = 'accuracy' is not a metric of "
                                          r"regression tasks \(\[data\] kind\); choose one of pearson"):
        task_from_dict({"data": {"kind": "regression"}, "train": {"metric_for_best": "accuracy"}},
                       "t.toml")
    with pytest.raises(ConfigError, match=r"\[data\] kind = 'multi'; choose one of"):
        task_from_dict({"data": {"kind": "multi"}}, "t.toml")


@pytest.mark.parametrize(("kind", "row", "said", "names"), [
    (SingleLabel(), lambda row: None if row.endswith("\tneg") else row,
     "a single_label task needs two labels or more; it has 1: 'pos'", ["pos"]),
    (MultiLabel(), lambda row: row.rsplit("\t", 1)[0] + "\t",
     "a multi_label task needs one label or more", []),
], ids=lambda value: getattr(value, "name", None))
def test_a_task_of_too_few_labels_is_refused_before_training(tmp_path, tiny_model_dir, capsys,
                                                             kind, row, said, names):
    """Every train row 'pos': cross-entropy over one class is 0 whatever the model says, and the
    run reported accuracy 1.0 for a model that learnt nothing. No label in any multi-label row:
    a head of 0 outputs, whose NaN loss at step 1 was blamed on the lr."""
    from conftest import write_toy_task

    from nlptrain import Trainer
    from nlptrain.cli import main
    from nlptrain.models import load_model

    task = write_toy_task(tmp_path, tiny_model_dir)
    task.write_text(task.read_text().replace('labels = ["neg", "pos"]\n', f'kind = "{kind.name}"\n'))
    # A multi-label test file keeps its labels: the error was that one of them was not the
    # task's (none, found in the train rows), not that the train rows have none.
    for name in ("train.tsv", "test.tsv") if names else ("train.tsv",):
        header, *rows = (tmp_path / name).read_text().splitlines()
        (tmp_path / name).write_text("\n".join([header, *filter(None, map(row, rows))]) + "\n")
    code = main(["train", "--task", str(task), "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    where = "task toy" if names else str(tmp_path / "train.tsv")
    assert f"{where}: {said}" in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=re.escape(said)):
        Trainer(load_model(str(tiny_model_dir), names, kind=kind), None, None)


def test_load_model_gives_a_regression_one_output_whatever_it_is_told(tiny_model_dir):
    """transformers sizes the head by id2label: [] gave 0 outputs, which the Trainer refused."""
    from nlptrain.models import load_model

    for names, named in (([], "score"), (["score"], "score"), (["similarity"], "similarity")):
        model = load_model(str(tiny_model_dir), names, kind=Regression())
        assert model.config.num_labels == 1 and model.config.id2label == {0: named}
    with pytest.raises(ConfigError, match=r"a regression model has one output, the score: got 2"):
        load_model(str(tiny_model_dir), ["a", "b"], kind=Regression())


def test_a_transformers_model_of_one_output_without_problem_type_is_a_regression():
    """transformers reads num_labels == 1 with no problem_type as regression (MSE); a softmax
    over one logit is 1.0 for every text, and cross-entropy over it 0."""
    from transformers import BertConfig, BertForSequenceClassification

    from nlptrain import Trainer
    from nlptrain.kinds import from_model_config

    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                        intermediate_size=8, num_labels=1)
    assert config.problem_type is None
    assert isinstance(from_model_config(config), Regression)
    trainer = Trainer(BertForSequenceClassification(config))
    logits, targets = torch.tensor([[0.5], [2.0]]), torch.tensor([1.0, 1.0])
    assert trainer.kind.name == "regression"
    assert trainer.loss_fn(logits, targets).item() == pytest.approx(0.625)
    for problem, kind in (("single_label_classification", SingleLabel),
                          ("multi_label_classification", MultiLabel)):
        assert isinstance(from_model_config(BertConfig(problem_type=problem, num_labels=2)), kind)
    assert isinstance(from_model_config(BertConfig(num_labels=3)), SingleLabel)


@pytest.mark.parametrize("kind", [SingleLabel(), MultiLabel(), Regression()], ids=lambda k: k.name)
def test_an_empty_evaluation_set_is_one_clear_error(tiny_model_dir, kind):
    """scikit-learn's 'Found empty input array' (classes), or NaN and a 0.0 Pearson taken for the
    best model (regression), after an epoch of training: instead, say what is empty."""
    from nlptrain import Trainer
    from nlptrain.models import load_model

    names = ["score"] if isinstance(kind, Regression) else ["a", "b"]
    trainer = Trainer(load_model(str(tiny_model_dir), names, kind=kind), kind=kind)
    empty = TokenizedDataset(np.zeros(0, np.int32), np.zeros(1, np.int64),
                             np.zeros((0, 2) if isinstance(kind, MultiLabel) else 0,
                                      np.float32 if kind.name != "single_label" else np.int64))
    with pytest.raises(DataError, match=r"the evaluation set holds no rows"):
        trainer.evaluate(empty)


def test_a_resume_that_picks_the_best_model_by_another_metric_is_refused(tmp_path):
    """The checkpoint's best score is the old metric's: a loss of 0.4 was compared with an
    accuracy of 0.9 (and found better), so best/ and early stopping followed neither metric."""
    from nlptrain.config import TrainConfig
    from nlptrain.runs import prepare_run_dir

    def task(metric: str) -> dict:
        return TaskConfig(train=TrainConfig(metric_for_best=metric)).to_dict()

    folder = tmp_path / "run"
    assert prepare_run_dir(folder, task(""), 1, resume=False, overwrite=False) is False
    # The kind's own metric, named or not, is the same metric.
    assert prepare_run_dir(folder, task("accuracy"), 1, resume=True, overwrite=False) is True
    with pytest.raises(ConfigError, match=r"run: a resume keeps the run's metric_for_best and "
                                          r"best_is \('accuracy' -> 'loss'\)"):
        prepare_run_dir(folder, task("loss"), 1, resume=True, overwrite=False)
    lower = TaskConfig(train=TrainConfig(best_is="lower")).to_dict()  # the same metric, turned round
    with pytest.raises(ConfigError, match=r"\('accuracy' -> 'accuracy \(lower is better\)'\)"):
        prepare_run_dir(folder, lower, 1, resume=True, overwrite=False)
