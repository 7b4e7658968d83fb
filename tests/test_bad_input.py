"""Bad input: one clear error naming the file (and line), exit 1, nothing left in the run dir.
Bad options and overrides: test_bad_options.py; bad --callback files: test_callback_files.py; a
model that cannot serve: test_bad_model.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_errors import edit, train

from nlptrain.cli import main
from nlptrain.errors import ConfigError


def too_few_to_hold_out(data: Path) -> None:
    """10 train rows of 2 classes: valid_size 0.1 holds out 1, too few to stratify."""
    rows = [f"{word} {i}\t{label}" for i in range(5) for word, label in (("good", "pos"), ("bad", "neg"))]
    (data / "train.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    edit(data / "toy.toml", "[data]\n", "[data]\nvalid_size = 0.1\n")


DATA_ERRORS = {
    "missing file": (lambda d: (d / "train.tsv").unlink(), r"train\.tsv: train file not found"),
    "empty file": (lambda d: (d / "train.tsv").write_text(""), r"train\.tsv: train file holds no rows"),
    "row without label": (lambda d: (d / "train.tsv").write_text("text\tlabel\nfine\tpos\nno label\n"),
                          r"train\.tsv:3: 1 column\(s\), expected at least 2"),
    "unknown label": (lambda d: (d / "test.tsv").write_text("text\tlabel\nfine\tpos\nhm\tmeh\n"),
                      r"test\.tsv:3: label 'meh' is not one of the task's labels"),
    "labels in CSV quotes": (lambda d: (d / "test.tsv").write_text('text\tlabel\n"fine"\t"pos"\n'),
                             r"test\.tsv:2: label '\"pos\"' is not one of the task's labels "
                             r"\['neg', 'pos'\]; the file quotes its cells as CSV does: give --quoted"),
    "separated by ';'": (lambda d: (d / "train.tsv").write_text("text;label\nfine;pos\n"),
                         r"train\.tsv:1: no text column 'text' in the header \['text;label'\]; the "
                         r"header is one cell: is the file separated by ';'\? Commas"),
    "undecodable bytes": (lambda d: (d / "train.tsv").write_bytes(b"text\tlabel\nna\xefve\tpos\n"),
                          r"train\.tsv:2: byte 0xef at column 3 is not UTF-8"),
    "too few rows to hold out": (too_few_to_hold_out,
                                 r"train\.tsv: \[data\] valid_size = 0\.1 of 10 train rows holds "
                                 r"out 1 and keeps 9, but a stratified split needs a row of each of "
                                 r"the 2 classes"),
}


@pytest.mark.parametrize("case", list(DATA_ERRORS))
def test_bad_data_is_one_clear_error_and_no_run_dir(capsys, toy_task, tmp_path, case):
    damage, message = DATA_ERRORS[case]
    damage(toy_task.parent)
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1
    assert re.search(message, err), err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_test_files_wrong_header_is_said_before_the_train_file_is_read(capsys, toy_task, tmp_path):
    """Its header was read after the train file was read and tokenized (minutes, for a large one):
    here the train file's own fault, at its last line, stands in for that time."""
    data = toy_task.parent
    train_text = (data / "train.tsv").read_text()
    (data / "train.tsv").write_text(train_text + "no label here\n")
    (data / "test.tsv").write_text("sentence\tlabel\nfine\tpos\n")
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1 and "test.tsv:1: no text column 'text' in the header" in err, err


def test_unknown_task_key_lists_the_valid_ones(capsys, toy_task, tmp_path):
    edit(toy_task, "epochs = 2", "epochs = 2\nlearning_rate = 1e-3")
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1
    assert "toy.toml:14 [train]: unknown key 'learning_rate'. Valid keys: epochs, batch_size" in err
    assert " lr," in err


def test_wrong_type_in_task_file(capsys, toy_task, tmp_path):
    edit(toy_task, "epochs = 2", 'epochs = "two"')
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1 and "toy.toml:13 [train]: 'epochs' must be int, got str 'two'" in err


def test_invalid_toml_names_the_line(capsys, toy_task, tmp_path):
    edit(toy_task, "epochs = 2", "epochs = = 2")
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1 and re.search(r"toy\.toml: not valid TOML: .*line \d+", err)


def test_task_file_not_in_utf8_names_the_line(capsys, toy_task, tmp_path):
    toy_task.write_bytes(toy_task.read_bytes().replace(b'name = "toy"', b'name = "caf\xe9"'))
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1 and "Traceback" not in err
    assert re.search(r"toy\.toml:2: byte 0xe9 is not UTF-8 \(a TOML file must be UTF-8\)", err), err


@pytest.mark.parametrize("labels", ['["neg", "pos", "pos"]', '{ n = "neg", p = "neg", q = "pos" }'])
def test_a_label_named_twice_is_refused_before_training(capsys, toy_task, tmp_path, labels):
    edit(toy_task, 'labels = ["neg", "pos"]', f"labels = {labels}")
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1 and "Traceback" not in err
    assert "toy.toml:7: [data] labels: 'neg' named more than once" in err or \
        "toy.toml:7: [data] labels: 'pos' named more than once" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("weights", "message"), [
    ("[1.0, 2.0, 3.0]", r"\[train\] class_weights = \[1\.0, 2\.0, 3\.0\]: give 'balanced' or one "
                        r"number per label \(2: neg, pos\)"),
    ('"balanced"', r"\[train\] class_weights = 'balanced': no training row has the label\(s\) "
                   r"\['pos'\]"),
    ("[1, 0]", r"\[train\] class_weights = \[1, 0\]: weight 0 for 'pos' makes the loss of a "
               r"batch of only those rows 0/0"),  # (a run stopped on a "non-finite loss")
])
def test_class_weights_that_do_not_fit_the_labels_leave_no_run_dir(capsys, toy_task, tmp_path,
                                                                   weights, message):
    edit(toy_task, "epochs = 2", f"epochs = 2\nclass_weights = {weights}")
    train_file = toy_task.parent / "train.tsv"
    train_file.write_text("\n".join(line for line in train_file.read_text().splitlines()
                                    if not line.endswith("\tpos")) + "\n")
    code, err = train(capsys, toy_task, tmp_path / "run")
    assert code == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_early_stopping_without_a_validation_set_is_refused_not_run_on_the_test_set(
        capsys, toy_task, tmp_path):
    """Without a validation set the evaluations during training score the test set: stopping on
    them would tune the run on its test set. Refused before a run directory exists; with a
    validation split the same command trains."""
    code, err = train(capsys, toy_task, tmp_path / "run", "--early-stopping", "1")
    assert code == 1 and "[train] early_stopping = 1 needs a validation set" in err, err
    assert "valid_size = 0.1" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code, err = train(capsys, toy_task, tmp_path / "run", "--early-stopping", "1",
                      "--valid-size", "0.2", "--epochs", "1")
    assert code == 0, err


@pytest.mark.parametrize("option", [["--seed", "-1"], ["--seed", "5000000000"],
                                    ["--split-seed", "-1", "--valid-size", "0.2"]])
def test_a_seed_out_of_numpys_range_is_one_line_not_a_traceback(capsys, toy_task, tmp_path, option):
    code, err = train(capsys, toy_task, tmp_path / "run", *option)
    assert code == 1 and "seed must be in [0, 4294967295]" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_resume_of_a_folder_with_no_run_says_a_new_run_starts(capsys, toy_task, tmp_path):
    """A typo in --output-dir with --resume: said, not passed off as the run continued (a
    requeued job's first start, with --resume in its script, still trains)."""
    code, err = train(capsys, toy_task, tmp_path / "typo", "--resume", "--epochs", "1")
    assert code == 0 and "typo: no run here to resume (no config.json); a new run starts" in err


def test_a_metric_for_best_the_task_cannot_compute_is_refused_before_training(capsys, toy_task,
                                                                               tmp_path):
    """GLUE's binary F1 on three labels: refused from the task file's labels, and from the labels
    found in the data, before a step is trained; so is a log interval of 0."""
    code, err = train(capsys, toy_task, tmp_path / "run", "--metric-for-best", "f1",
                      "--set", 'data.labels=["neg", "pos", "meh"]')
    assert code == 1 and "metric_for_best = 'f1' is the binary F1" in err and "has 3" in err
    edit(toy_task, 'labels = ["neg", "pos"]', "")
    with (toy_task.parent / "train.tsv").open("a") as handle:
        handle.write("so-so\tmeh\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--metric-for-best", "f1")
    assert code == 1 and "task toy: [train] metric_for_best = 'f1'" in err and "has 3" in err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code, err = train(capsys, toy_task, tmp_path / "run", "--log-every", "0")
    assert code == 1 and "[train] log_every must be at least 1" in err


def test_unknown_task_name(capsys, tmp_path):
    code = main(["train", "--task", "no-such-task", "--output-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1 and "no-such-task: no such task file, and not a shipped task" in err
    assert "rt-polarity" in err  # lists the shipped tasks


def test_run_dir_holding_another_run_is_refused(capsys, toy_task, tmp_path):
    run = tmp_path / "run"
    assert train(capsys, toy_task, run, "--epochs", "1")[0] == 0
    before = sorted(p.name for p in run.iterdir())
    code, err = train(capsys, toy_task, run, "--epochs", "1")
    assert code == 1 and "already holds a run; use --resume to continue it, --overwrite" in err
    assert sorted(p.name for p in run.iterdir()) == before  # untouched
    # The checkpoint's optimizer state would not load into other parameter groups.
    code, err = train(capsys, toy_task, run, "--resume", "--lr", "1e-5", "--layer-lr-decay", "0.9")
    assert code == 1 and "a resume keeps the run's optimizer parameter groups, and these " \
        "changed: layer_lr_decay 1.0 -> 0.9; resume with the run's values, or start a new run" \
        in err, err
    assert err.count("error:") == 1 and "Traceback" not in err
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    code, err = train(capsys, toy_task, run, "--resume", "--max-length", "24")
    assert code == 1 and "holds a run with another model ([model] max_length 32 -> 24)" in err, err
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached  # refused before reading
    edit(toy_task, 'labels = ["neg", "pos"]', 'labels = ["pos", "neg"]')
    code, err = train(capsys, toy_task, run, "--resume")
    assert code == 1 and "holds a run with another data ([data] labels ['neg', 'pos'] -> " \
        "['pos', 'neg'])" in err, err
    edit(toy_task, 'labels = ["pos", "neg"]', 'labels = ["neg", "pos"]')
    code, err = train(capsys, toy_task, run, "--resume", "--epochs", "1", "--set",
                      f"data.cache_dir={tmp_path / 'elsewhere'}")
    assert code == 0, err  # where the token cache lives changes no row: no other data
    assert train(capsys, toy_task, run, "--overwrite", "--epochs", "1")[0] == 0


def test_torchruns_summary_names_nlptrains_error_as_the_root_cause(toy_task, tmp_path):
    from conftest import run_cli

    DATA_ERRORS["unknown label"][0](toy_task.parent)
    out = run_cli(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "run")],
                  tmp_path, nproc=2)
    assert out.returncode == 1
    root_cause = out.stderr[out.stderr.index("Root Cause (first observed failure):"):]
    assert "rank      : 0 (local_rank: 0)" in root_cause
    assert re.search(r"traceback : error: \S*test\.tsv:3: label 'meh' is not one of the task's "
                     r"labels", root_cause), root_cause
    assert "error_file: <N/A>" not in out.stderr and "To enable traceback" not in out.stderr
    # No worker traceback (torchrun still prints its own, ending in ChildFailedError).
    assert not re.search(r'File ".*/nlptrain/', out.stderr), out.stderr
    assert "traceback : stopped: rank 0 failed (see the root cause)" in out.stderr  # rank 1's


def test_a_resume_the_run_cannot_take_is_one_error_before_any_worker_starts(capsys, toy_task,
                                                                           tmp_path):
    run = tmp_path / "run"
    assert train(capsys, toy_task, run, "--epochs", "1")[0] == 0
    code, err = train(capsys, toy_task, run, "--resume", "--seed", "7", "--nproc", "2")
    assert code == 1 and err.count("error:") == 1, err
    assert "a resume keeps the run's data order" in err and "launched by" not in err, err


def test_per_rank_files_with_a_label_the_task_lacks_are_refused_before_overwrite(capsys, toy_task,
                                                                                  tmp_path):
    """The labels `split` saw are checked against the task's before the run directory is
    touched: with --overwrite, the earlier run is still there after the refusal."""
    source = tmp_path / "all.tsv"
    source.write_text((toy_task.parent / "train.tsv").read_text() + "a hesitant review\tmaybe\n")
    assert main(["split", str(source), "--world-size", "1", "--out", str(tmp_path / "parts")]) == 0
    earlier = tmp_path / "run"
    assert train(capsys, toy_task, earlier, "--epochs", "1", "--steps-per-epoch", "1")[0] == 0
    code, err = train(capsys, toy_task, earlier, "--train-shards", str(tmp_path / "parts"),
                      "--overwrite")
    assert code == 1 and "Traceback" not in err
    assert "manifest.json: the per-rank files hold labels the task does not name: maybe" in err
    assert (earlier / "model" / "model.safetensors").is_file()  # not replaced by a refused run


def test_a_missing_data_folder_says_how_to_give_one(tmp_path, monkeypatch):
    """A user's task file without data_dir is told it may read from its own folder; a shipped
    task, where its data is (the data folder of --data-dir)."""
    from nlptrain.cli import build_parser, resolve_task

    monkeypatch.delenv("NLPTRAIN_DATA_DIR", raising=False)
    own = tmp_path / "mine.toml"
    own.write_text('name = "mine"\n[data]\ntrain = "train.tsv"\n')
    with pytest.raises(ConfigError, match=rf'pass --data-dir DIR, or set data_dir = "\." in '
                                          rf'{re.escape(str(own))} to read its paths'):
        resolve_task(build_parser().parse_args(["train", "--task", str(own)]))
    with pytest.raises(ConfigError, match=r"pass --data-dir DIR \(e\.g\. the folder holding rt-pol"):
        resolve_task(build_parser().parse_args(["train", "--task", "sst2"]))
    # The folder from the environment, not there: named as such (review 99: "check --data-dir"),
    # where the task reads from it; a task of absolute paths reads nothing there (review 100).
    monkeypatch.setenv("NLPTRAIN_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=rf"NLPTRAIN_DATA_DIR={re.escape(str(tmp_path / 'nope'))}: "
                                          r"no such folder, and the task reads sst-2/train\.tsv "):
        resolve_task(build_parser().parse_args(["train", "--task", "sst2"]))
    absolute = tmp_path / "absolute.toml"
    absolute.write_text(f'name = "mine"\n[data]\ntrain = "{tmp_path / "train.tsv"}"\n')
    assert resolve_task(build_parser().parse_args(["train", "--task", str(absolute)])).name == "mine"


@pytest.mark.distributed
def test_drop_last_that_drops_every_batch_is_one_error_not_an_untrained_run(toy_task, tmp_path):
    """160 train rows on 2 ranks in batches of 128 with drop_last: no rank has a whole batch. One
    process trains 1 step on them, so the run must not pass for trained with 0 under --nproc."""
    from conftest import run_cli

    out = run_cli(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "run"),
                   "--drop-last", "--batch-size", "128", "--nproc", "2"], tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.count("the training data makes no batch on some rank: drop_last drops every "
                            "batch, as a rank gets 80 row(s), fewer than batch_size 128; lower "
                            "batch_size, run fewer processes or leave drop_last off") == 1, out.stderr
    assert not (tmp_path / "run" / "model").exists()


@pytest.mark.parametrize("option", [None, "--overwrite", "--resume"])
def test_a_folder_of_other_files_is_never_trained_in_nor_replaced(capsys, toy_task, tmp_path, option):
    """An --output-dir that names someone's folder (a typo, a home folder): it holds no run, so
    "already holds a run; use --resume" would mislead, and --overwrite would delete their files."""
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    code, err = train(capsys, toy_task, mine, "--epochs", "1", *([option] if option else []))
    assert code == 1 and f"{mine}: holds thesis.txt, and no nlptrain run (no config.json)" in err, err
    assert "a new run starts" not in err and err.count("error:") == 1
    assert [p.name for p in mine.iterdir()] == ["thesis.txt"]  # nor a lock file of ours left


@pytest.mark.parametrize("option", ["--overwrite", "--resume"])
@pytest.mark.parametrize(("config", "why"), [
    ('{"model_type": "bert", "num_labels": 2}', "its config.json is not a run's record"),
    ('{"task": {"name": "cut sh', "its config.json is not JSON: "),
])
def test_a_config_json_that_is_no_runs_record_makes_no_run_of_its_folder(capsys, toy_task, tmp_path,
                                                                         option, config, why):
    """A saved model's folder (or a run's record cut short) as --output-dir: told "already holds
    a run; ... --overwrite to replace it", --overwrite deleted the model."""
    model = tmp_path / "saved-model"
    model.mkdir()
    (model / "config.json").write_text(config)
    (model / "model.safetensors").write_bytes(b"weights")
    code, err = train(capsys, toy_task, model, "--epochs", "1", option)
    assert code == 1 and f"{model}: holds config.json, model.safetensors, and no nlptrain run " \
        f"({why}" in err, err
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]


def test_a_resume_without_a_task_of_a_folder_with_no_run_is_refused(capsys, tmp_path):
    """--resume goes on with the run's own task: with no run there (a typo), the default task
    trained a new run instead."""
    from nlptrain.cli import main

    code = main(["train", "--output-dir", str(tmp_path / "no-such-run"), "--resume"])
    err = capsys.readouterr().err
    assert code == 1 and f"error: --resume: no run in {tmp_path / 'no-such-run'} to go on with" in err
    assert not (tmp_path / "no-such-run").exists()
