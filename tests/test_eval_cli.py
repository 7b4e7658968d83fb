"""`nlptrain eval`: the same accuracy, macro-F1, per-class table and confusion matrix with 1 and 2
processes, on a set that does not split evenly between the ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli, write_toy_tsv
from cpu_speed import pretend_cpu_speedups

from nlptrain.cli import main
from nlptrain.report import metrics_text


@pytest.fixture(scope="module")
def labelled_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A saved classifier with the toy task's labels; large random weights give mixed guesses."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("neg-pos")
    config = BertConfig.from_pretrained(tiny_model_dir, initializer_range=0.5,
                                        id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    torch.manual_seed(3)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def test_eval_is_identical_with_1_and_2_processes(toy_task: Path, labelled_model: Path,
                                                  capsys) -> None:
    work = toy_task.parent
    write_toy_tsv(work / "odd.tsv", 41, seed=5)  # 21 + 20 rows on two ranks
    args = ["eval", "--model", str(labelled_model), "--task", str(toy_task), "--set", "data.test=odd.tsv"]
    two = run_cli(args, cwd=work, nproc=2)
    assert two.returncode == 0, two.stderr
    capsys.readouterr()
    assert main([*args, "--json"]) == 0  # one process: this one

    metrics = json.loads(capsys.readouterr().out)
    assert metrics["rows"] == 41 and sum(map(sum, metrics["confusion_matrix"])) == 41
    assert 0 < metrics["correct"] < 41  # mixed guesses: the numbers below mean something
    assert set(metrics["per_class"]) == {"neg", "pos"}
    # Printed once, by rank 0, and the same to the last digit shown: the confusion matrix and
    # supports are exact counts, and accuracy, macro-F1, precision and recall follow from them.
    assert two.stdout.strip() == metrics_text(metrics)
    text = two.stdout
    for part in (f"rows 41  accuracy {metrics['accuracy']:.4f}  macro-F1 {metrics['macro_f1']:.4f}",
                 "precision", "recall", "confusion matrix (rows: true label, columns: predicted)"):
        assert part in text, part


def test_eval_no_cache_leaves_no_token_cache(toy_task: Path, labelled_model: Path, capsys) -> None:
    args = ["eval", "--model", str(labelled_model), "--task", str(toy_task), "--json"]
    cache = toy_task.parent / "cache"
    assert main([*args, "--no-cache"]) == 0 and not cache.exists()
    uncached = json.loads(capsys.readouterr().out)
    assert main(args) == 0 and any(cache.iterdir())  # the default writes it
    assert json.loads(capsys.readouterr().out) == uncached
    elsewhere = toy_task.parent / "elsewhere"
    assert main([*args, "--cache-dir", str(elsewhere)]) == 0 and any(elsewhere.iterdir())
    assert json.loads(capsys.readouterr().out) == uncached


def test_eval_of_a_test_file_does_not_read_train(toy_task: Path, labelled_model: Path,
                                                 capsys) -> None:
    """The task names its labels and has a test file: `--split test` needs nothing of train
    (SST-2: 67k train rows read and tokenized for 872 scored). A held-out split still does."""
    args = ["eval", "--model", str(labelled_model), "--task", str(toy_task), "--json", "--no-cache"]
    assert main(args) == 0
    with_train = json.loads(capsys.readouterr().out)
    (toy_task.parent / "train.tsv").unlink()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == with_train
    assert main([*args, "--split", "valid", "--set", "data.valid_size=0.25"]) == 1
    assert "train.tsv" in capsys.readouterr().err  # the held-out rows come from train


def test_eval_of_one_split_reads_no_other_splits_file(toy_task: Path, labelled_model: Path,
                                                      capsys) -> None:
    """`--split train` scores train's rows (160 here) and reads no test file: a broken one does
    not stop it. The test rows held out of train by test_size stay out of it, as in the run."""
    args = ["eval", "--model", str(labelled_model), "--task", str(toy_task), "--json", "--no-cache",
            "--split", "train"]
    (toy_task.parent / "test.tsv").write_text("text\tlabel\nfine\tnot-a-label\n")
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 160
    assert main([*args, "--set", "data.test=", "--set", "data.test_size=0.25"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 120
    assert main([*args[:-2], "--split", "test"]) == 1
    assert "test.tsv:2" in capsys.readouterr().err  # the split asked for is read, and checked
    # A file to score with another split: the split was scored and the file never read.
    assert main([*args, "--test-file", "mine.tsv"]) == 1
    assert capsys.readouterr().err == ("error: --test-file mine.tsv is scored as the test set, "
                                       "and --split train scores the task's train set instead: "
                                       "drop --split\n")


def test_eval_of_a_file_elsewhere_caches_its_tokens_next_to_that_file(
        tmp_path: Path, tiny_model_dir: Path, labelled_model: Path, capsys) -> None:
    from conftest import write_toy_task

    (tmp_path / "task").mkdir()
    (tmp_path / "mine").mkdir()
    task = write_toy_task(tmp_path / "task", tiny_model_dir)  # no cache_dir: next to the data
    write_toy_tsv(tmp_path / "mine" / "lab.tsv", 12, seed=7)
    args = ["eval", "--model", str(labelled_model), "--task", str(task), "--json",
            "--test-file", str(tmp_path / "mine" / "lab.tsv")]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 12
    assert any((tmp_path / "mine" / ".nlptrain_cache").iterdir())
    assert not (tmp_path / "task" / ".nlptrain_cache").exists()


def test_a_model_whose_labels_are_in_another_order_than_the_tasks_found_ones_is_scored_by_name(
        toy_task: Path, labelled_model: Path, tmp_path: Path, capsys) -> None:
    """Without [data] labels, eval takes the model's own (no train file is read for them): a
    model saying (pos, neg) is scored by name. Scored by position (the bug once), each row's
    truth was read as the other label; here the swapped names flip every prediction."""
    from transformers import AutoConfig

    task = toy_task.read_text().replace('labels = ["neg", "pos"]\n', "")
    toy_task.write_text(task)
    args = ["eval", "--task", str(toy_task), "--json", "--no-cache"]
    assert main([*args, "--model", str(labelled_model)]) == 0  # the same labels: scored
    kept = json.loads(capsys.readouterr().out)
    swapped = tmp_path / "swapped"
    shutil.copytree(labelled_model, swapped)
    config = AutoConfig.from_pretrained(swapped)
    config.id2label, config.label2id = {0: "pos", 1: "neg"}, {"pos": 0, "neg": 1}
    config.save_pretrained(swapped)
    assert main([*args, "--model", str(swapped)]) == 0
    flipped = json.loads(capsys.readouterr().out)
    assert flipped["accuracy"] == pytest.approx(1 - kept["accuracy"])
    assert 0.05 < kept["accuracy"] < 0.95  # (else the flip would show nothing)


def test_a_file_of_another_format_is_scored_without_reading_the_train_file_in_it(
        toy_task: Path, labelled_model: Path, tmp_path: Path, capsys) -> None:
    """A task without [data] labels: eval read the train file for them, with the options meant
    for the scored file (a headerless CSV): 'train.tsv:1: 1 column(s), expected at least 2'."""
    toy_task.write_text(toy_task.read_text().replace('labels = ["neg", "pos"]\n', ""))
    scored = tmp_path / "plain.csv"
    scored.write_text("pos,a great film\nneg,awful and dull\npos,a joy\n")
    assert main(["eval", "--task", str(toy_task), "--model", str(labelled_model), "--no-cache",
                 "--json", "--test-file", str(scored), "--data-format", "csv", "--no-header",
                 "--text-column", "1", "--label-column", "0"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["rows"] == 3
    # Labels written otherwise than the model names them: the model's labels are said to be
    # the ones read, with the table that maps them (not "add '1' to the labels").
    (tmp_path / "ids.csv").write_text("1,a great film\n0,awful and dull\n")
    assert main(["eval", "--task", str(toy_task), "--model", str(labelled_model), "--no-cache",
                 "--test-file", str(tmp_path / "ids.csv"), "--data-format", "csv", "--no-header",
                 "--text-column", "1", "--label-column", "0"]) == 1
    err = capsys.readouterr().err
    assert "ids.csv:1: label '1' is not one of the task's labels ['neg', 'pos']; the task names no " \
        f"labels, so they are the model's ({labelled_model}): if the file writes them otherwise, " \
        "give the task the model's table, e.g. --set data.labels='{0 = \"neg\", ...}'" in err, err


def test_a_file_of_other_column_names_is_scored_with_the_options_its_error_names(
        toy_task: Path, labelled_model: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other.tsv"
    other.write_text("review\tverdict\ngreat film\tpos\nawful\tneg\n")
    args = ["eval", "--model", str(labelled_model), "--task", str(toy_task), "--no-cache", "--json",
            "--test-file", str(other)]
    assert main(args) == 1
    assert "no text column 'text' in the header ['review', 'verdict']; set text_column in the " \
           "task's [data] (or --text-column)" in capsys.readouterr().err
    assert main([*args, "--text-column", "review", "--label-column", "verdict"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 2
    # A file of another format than the task's [data] format (the toy task's is tsv): its
    # whole line is one header cell; the error says which format it looks like.
    other.write_text('{"text": "great film", "label": "pos"}\n')
    assert main([*args, "--set", "data.format=tsv"]) == 1
    assert "the header is one cell: is the file jsonl? Say so in its own table (--set " \
           "data.<train|valid|test>.format=jsonl)" in capsys.readouterr().err
    assert main([*args[:-2], "--set", "data.format=tsv", "--set", f"data.test={{path='{other}', "
                 "format='jsonl'}"]) == 0  # (args[:-2]: without its --test-file)


def test_eval_of_a_runs_model_scores_as_the_run_did(toy_task: Path, tmp_path: Path, capsys,
                                                   monkeypatch) -> None:
    """Under precision "auto", eval takes the precision the model was trained and tested in (its
    config.json records it), not a new probe of this machine: its test metrics are the run's to
    the bit. And results.json counts epochs from 1, as metrics.jsonl does."""
    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--precision", "bf16",
                 "--valid-size", "0.25"]) == 0
    capsys.readouterr()
    pretend_cpu_speedups(monkeypatch, bf16=2.0)  # a CPU that runs bf16 well
    assert main(["eval", "--model", str(run / "model"), "--task", str(toy_task), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "precision auto: bf16 (the model was trained and tested in it)" in err
    results = json.loads((run / "results.json").read_text())
    scored = json.loads(out)
    for key in ("accuracy", "macro_f1", "loss", "confusion_matrix"):
        assert scored[key] == results["test"][key], key
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    best = results["valid"]
    assert [e["epoch"] for e in evals if e["step"] == best["step"]] == [best["epoch"]]
    # No --task: the run's own (its config.json), with the options it ran with: the held-out
    # validation rows are the run's, and model/ (the best model) scores on them as it did.
    assert main(["eval", "--model", str(run / "model"), "--split", "valid", "--json"]) == 0
    out, err = capsys.readouterr()
    assert f"the run's own, from {run / 'config.json'}" in err
    scored = json.loads(out)
    for key in ("accuracy", "macro_f1", "loss", "rows"):
        assert scored[key] == best[key], key
    monkeypatch.chdir(run / "model")  # --model . is the same folder (its parent is the run)
    assert main(["eval", "--model", ".", "--split", "valid", "--json"]) == 0
    assert json.loads(capsys.readouterr()[0])["accuracy"] == best["accuracy"]
    # A CPU that runs bf16 far slower than fp32: auto scores in fp32 and names the option that
    # keeps the run's precision, which eval takes as predict does.
    pretend_cpu_speedups(monkeypatch, bf16=0.02)
    task = ["eval", "--model", ".", "--task", str(toy_task), "--json"]  # the task's auto
    assert main(task) == 0
    assert "--precision bf16 scores exactly as its run did" in capsys.readouterr()[1]
    assert main([*task, "--precision", "bf16"]) == 0
    assert json.loads(capsys.readouterr()[0])["loss"] == results["test"]["loss"]


def test_the_printed_confusion_matrix_keeps_long_label_names_whole() -> None:
    names = ["entailment", "not_entailment"]
    metrics = {"rows": 3, "accuracy": 2 / 3,
               "per_class": {n: {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 1}
                             for n in names},
               "confusion_matrix": [[1, 0], [1, 1]]}
    header, *rows = metrics_text(metrics).split("columns: predicted)\n")[1].splitlines()
    assert header.split() == names
    assert [row.split() for row in rows] == [["entailment", "1", "0"], ["not_entailment", "1", "1"]]


def test_eval_of_a_model_out_of_its_run_without_task_says_it_scores_the_default(
        labelled_model: Path, capsys) -> None:
    main(["eval", "--model", str(labelled_model)])  # (then refused: other label names)
    assert f"warning: no --task, and no run's config.json beside {labelled_model}: scoring on " \
           "the default task" in capsys.readouterr().err


def test_ctrl_c_in_eval_says_it_stopped_not_how_to_resume_a_training_run(monkeypatch, capsys) -> None:
    from nlptrain import cli

    def interrupted(args) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_eval", interrupted)
    assert main(["eval", "--model", "any"]) == 130
    err = capsys.readouterr().err
    assert "interrupted: eval stopped before it finished" in err and "resume" not in err


def test_eval_of_a_model_folder_that_is_not_there_says_that_alone(tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--model", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "nosuch" in err and "error:" in err
    assert "scoring on the default task" not in err, err


def test_eval_refuses_pairs_for_a_model_of_single_texts_and_says_when_it_cuts_otherwise(
        toy_task: Path, tmp_path: Path, capsys) -> None:
    """A model trained on single texts, scored on pairs, gives numbers without meaning: refused,
    as predict refuses it. A task of another max_length than the model's training is said. A
    file without a header is read with the option the readers' error names."""
    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1"]) == 0
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("text\tother\tlabel\ngreat film\tyes\tpos\nawful\tno\tneg\n")
    args = ["eval", "--model", str(run / "model"), "--task", str(toy_task), "--no-cache", "--json"]
    capsys.readouterr()
    assert main([*args, "--test-file", str(pairs), "--text-pair-column", "other"]) == 1
    assert "was trained on single texts, and the test set holds pairs: score its first texts " \
           "alone with --text-pair-column ''" in capsys.readouterr().err
    assert main([*args, "--test-file", str(pairs)]) == 0
    assert "max_length" not in capsys.readouterr().err  # the task's is the model's: nothing said
    assert main([*args, "--test-file", str(pairs), "--set", "model.max_length=16"]) == 0
    assert "scoring at max_length 16 (task toy); the model was trained at 32 (--set " \
           "model.max_length=32 scores as its run did)" in capsys.readouterr().err
    bare = tmp_path / "bare.tsv"
    bare.write_text("pos\tgreat film\nneg\tawful\n")
    numbered = [*args, "--test-file", str(bare), "--text-column", "1", "--label-column", "0"]
    assert main(numbered) == 1
    assert "Give --no-header" in capsys.readouterr().err
    assert main([*numbered, "--no-header"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 2


@pytest.mark.distributed
def test_a_model_that_does_not_fit_the_task_is_said_once_by_two_processes(toy_task: Path,
                                                                          labelled_model: Path) -> None:
    """Every rank finds the same mismatch (the model's and the task's facts): rank 0 says it."""
    done = run_cli(["eval", "--model", str(labelled_model), "--task", str(toy_task), "--set",
                    "data.kind=regression", "--set", "data.labels=[]"], cwd=toy_task.parent, nproc=2)
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if line.startswith(("error:", "[rank"))]
    assert len(said) == 1 and said[0].endswith("the model was trained for single_label, the task "
                                               "is regression"), done.stderr[-3000:]


def test_eval_of_a_runs_folder_names_its_model_folder_without_a_warning_against_it(
        toy_task: Path, tmp_path: Path, capsys) -> None:
    """Review 99: it warned "no run's config.json beside RUN", though RUN/config.json is the run's."""
    from nlptrain.task_files import load_task

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (run / "config.json").write_text(json.dumps({"task": load_task(toy_task).to_dict(), "world_size": 1}))
    assert main(["eval", "--model", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"did you mean {run / 'model'}?" in err and "warning" not in err, err
    # A record whose task does not load here (a key of another version) keeps the hint (review 100).
    record = json.loads((run / "config.json").read_text())
    record["task"]["data"]["no_such_key"] = 1
    (run / "config.json").write_text(json.dumps(record))
    assert main(["eval", "--model", str(run)]) == 1
    assert f"did you mean {run / 'model'}?" in capsys.readouterr().err
