"""Bad options and overrides: one line naming the option as it was typed (or the --set), exit 1
(argparse's usage errors: 2), nothing left in the run dir."""

from __future__ import annotations

import json

import pytest
from cli_errors import train

from nlptrain.cli import main


def test_unknown_override_key(capsys, toy_task, tmp_path):
    code, err = train(capsys, toy_task, tmp_path / "run", "--set", "train.lrr=0.1")
    assert code == 1 and "unknown key 'lrr'" in err and "Valid keys:" in err


@pytest.mark.parametrize(("override", "message"), [
    ("trian.lr=1e-5", "--set trian.lr=1e-5: unknown section 'trian'. Valid: data, model, train, "
                      "data.train, data.valid, data.test;"),
    ("data.tset.header=true", "unknown section 'data.tset'"),
    ("data.test.heder=true", "--set data.test.heder=true: unknown key 'heder'. Valid keys: path,"),
    # Words are no TOML values (numbers are: labels=0,1 is a list): the line shows the list.
    ("data.labels=neg, pos", "--set data.labels=neg, pos: 'labels' must be list | dict, got str "
                             "'neg, pos'; quote the list for the shell: "
                             "--set 'data.labels=[\"neg\",\"pos\"]'"),
    # (the shell took the quotes off: its brackets are no label's)
    ("data.labels=[neg,pos]", "; quote the list for the shell: --set 'data.labels=[\"neg\",\"pos\"]'"),
])
def test_an_override_of_an_unknown_section_is_one_line(capsys, toy_task, tmp_path, override, message):
    code, err = train(capsys, toy_task, tmp_path / "run", "--set", override)
    assert code == 1 and message in err, err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_an_unknown_log_level_is_a_usage_error(capsys, toy_task):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--task", str(toy_task), "--log-level", "verbose"])
    assert stop.value.code == 2 and "invalid choice: 'verbose'" in capsys.readouterr().err
    from nlptrain.cli import build_parser

    assert build_parser().parse_args(["train", "--log-level", "INFO"]).log_level == "info"


@pytest.mark.parametrize("order", [["--kind", "single_label", "--metric-for-best", "accuracy"],
                                   ["--set", "train.metric_for_best=accuracy",
                                    "--set", "data.kind=single_label"]])
def test_overrides_are_checked_together_in_any_order(tmp_path, order):
    """STS-B (regression, pearson) as a single_label task with accuracy: each override alone
    contradicts the other key's value in the task file, together they fit."""
    from nlptrain.cli import build_parser, resolve_task

    args = build_parser().parse_args(["train", "--task", "stsb", "--data-dir", str(tmp_path), *order])
    task = resolve_task(args)
    assert (task.data.kind, task.train.metric_for_best) == ("single_label", "accuracy")


def test_overrides_that_do_not_fit_together_are_named_in_the_error(capsys, toy_task, tmp_path):
    code, err = train(capsys, toy_task, tmp_path / "run", "--kind", "regression",
                      "--metric-for-best", "accuracy")
    assert code == 1 and "--kind, --metric-for-best: [train] metric_for_best = 'accuracy' is not " \
        "a metric of regression tasks" in err, err


def test_an_error_names_the_option_as_it_was_typed(capsys, toy_task, tmp_path):
    code, err = train(capsys, toy_task, tmp_path / "run", "--data-format", "xml")
    assert code == 1 and "error: --data-format: [data] format = 'xml'" in err, err  # not --format


def test_an_error_names_the_options_at_fault_not_every_one_given(capsys, toy_task, tmp_path):
    code, err = train(capsys, toy_task, tmp_path / "run", "--epochs", "3", "--lr=-1",
                      "--set", "train.batch_size=8")
    assert code == 1 and "error: --lr: [train] lr must be at least 0" in err, err
    code, err = train(capsys, toy_task, tmp_path / "run", "--epochs", "3", "--max-tokens", "64",
                      "--set", "data.streaming=true")
    assert "error: --max-tokens, --set data.streaming=true: [train] max_tokens needs" in err, err


@pytest.mark.parametrize(("flag", "value"), [("--threshold", "0.9"), ("--label-separator", "|")])
def test_a_multi_label_option_on_another_kind_is_refused_not_ignored(capsys, toy_task, tmp_path,
                                                                     flag, value):
    code, err = train(capsys, toy_task, tmp_path / "run", flag, value)
    key = flag[2:].replace("-", "_")
    assert code == 1 and f"error: {flag}: [data] {key} is for multi_label tasks; this one is " \
        "single_label ([data] kind)" in err, err
    assert not (tmp_path / "run").exists()


def test_labels_on_a_regression_task_are_refused_not_dropped(capsys, toy_task, tmp_path):
    # Labels given with the kind (in one task file, or both on the command line) are refused.
    code, err = train(capsys, toy_task, tmp_path / "run", "--set", "data.kind=regression",
                      "--set", "data.labels=['neg', 'pos']")
    assert code == 1 and "[data] labels name classes; a regression task has none: leave them " \
        "out (data.labels=[])" in err, err
    reg = tmp_path / "reg.toml"
    reg.write_text(toy_task.read_text().replace('labels = ["neg", "pos"]',
                                                'labels = ["neg", "pos"]\nkind = "regression"'))
    code, err = train(capsys, reg, tmp_path / "run")
    assert code == 1 and f"{reg}:7: [data] labels name classes" in err, err


def test_a_kind_switched_to_regression_leaves_the_tasks_class_labels_out(capsys, toy_task,
                                                                          tmp_path):
    # `--kind regression` on a task of classes (the default task's, a file's): its labels were
    # never the user's word about scores. A run recorded with them (before they were refused)
    # still resumes.
    scores = tmp_path / "scores.tsv"
    scores.write_text("text\tscore\n" + "".join(f"row {i} of words\t{i % 5 / 4}\n"
                                                  for i in range(40)))
    run = tmp_path / "run"
    args = ("--kind", "regression", "--train-file", str(scores), "--test-file", str(scores),
            "--label-column", "score", "--epochs", "1")
    code, err = train(capsys, toy_task, run, *args)
    assert code == 0, err
    saved = json.loads((run / "config.json").read_text())
    assert saved["task"]["data"]["labels"] == []
    saved["task"]["data"]["labels"] = ["neg", "pos"]  # as an older version recorded it
    (run / "config.json").write_text(json.dumps(saved))
    code, err = train(capsys, toy_task, run, *args[:-2], "--epochs", "2", "--resume")
    assert code == 0, err


@pytest.mark.parametrize(("flag", "value"), [
    ("--lr", "-1e-5"), ("--num-workers", "-1"), ("--eval-every", "-5"), ("--keep-checkpoints", "-1"),
    ("--weight-decay", "-0.1"), ("--checkpoint-every", "-2"), ("--num-hidden-layers", "-1")])
def test_negative_counts_and_rates_are_refused_naming_the_key(capsys, toy_task, tmp_path, flag,
                                                              value):
    key = flag[2:].replace("-", "_")
    for given in ([f"{flag}={value}"], [flag, value]):  # -1e-5 apart: argparse took it for an option
        code, err = train(capsys, toy_task, tmp_path / "run", *given)
        assert code == 1 and f"{flag}: [" in err and f"] {key} must be at least 0" in err, err
        assert err.count("error:") == 1 and "Traceback" not in err
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("given", "said"), [
    (["--batch-size", "100000000000000000000"], "--batch-size: [train] batch_size = "
     "100000000000000000000 is too large (at most 9223372036854775807)"),  # (islice's traceback)
    (["--max-tokens", "256", "--no-group-by-length"], "[train] group_by_length = false has no "
     "effect under max_tokens"),  # (taken, logged, and without effect)
])
def test_values_that_cannot_act_are_refused_in_one_line(capsys, toy_task, tmp_path, given, said):
    code, err = train(capsys, toy_task, tmp_path / "run", *given)
    assert code == 1 and said in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("option", "message"), [
    (["--nproc", "0"], "--nproc 0: give at least 1 process"),
    (["--nproc", "-1"], "--nproc -1: give at least 1 process"),
    (["--nproc", "2", "--max-restarts", "-1"], "--max-restarts -1: give 0 or more")])
def test_nproc_below_one_is_refused(capsys, toy_task, tmp_path, option, message):
    code, err = train(capsys, toy_task, tmp_path / "run", *option)
    assert code == 1 and f"error: {message}" in err, err


@pytest.mark.parametrize("argv", [["train", "--progress-every", "-5"],
                                  ["predict", "--model", "m", "--input", "-", "--timeout", "0"],
                                  ["predict", "--model", "m", "--input", "-", "--timeout", "nan"],
                                  ["predict", "--model", "m", "--input", "-", "--timeout", "1e15"]])
def test_a_wait_of_no_time_is_a_usage_error(capsys, argv):
    """--progress-every -5 logged every batch; predict --timeout -1 was a C++ stack dump under
    --nproc, then advice about [train] timeout, which predict has not."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    assert f"argument {argv[-2]}: '{argv[-1]}' is not a number of seconds > 0 and <= 2,000,000" \
        in capsys.readouterr().err  # (1e15 overflowed in torch, a traceback under --nproc)


@pytest.mark.parametrize(("given", "said"), [
    (["--max-length", "64"], "(eval takes this task key as --set model.max_length=64)"),
    (["--lr=3e-5"], "(eval takes this task key as --set train.lr=3e-5)"),
    (["--group-by-length"], "(eval takes this task key as --set train.group_by_length=true)"),
    (["--no-group-by-length"], "(eval takes this task key as --set train.group_by_length=false)")])
def test_a_task_keys_option_eval_has_not_names_its_set_form(capsys, given, said):
    """eval's own warning advises --set model.max_length=N; --max-length got 'did you mean
    --max-restarts?'."""
    with pytest.raises(SystemExit) as ended:
        main(["eval", "--model", "m", *given])
    assert ended.value.code == 2 and said in capsys.readouterr().err


def test_resume_and_overwrite_together_are_a_usage_error(capsys):
    """Together, --overwrite was unheeded and the run resumed."""
    with pytest.raises(SystemExit) as ended:
        main(["train", "--output-dir", "run", "--resume", "--overwrite"])
    assert ended.value.code == 2
    assert "argument --overwrite: not allowed with argument --resume" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["5", "0", "1", "-0.5"])
def test_a_threshold_that_is_no_probability_is_refused(capsys, toy_task, tmp_path, value):
    code, err = train(capsys, toy_task, tmp_path / "run", f"--threshold={value}")
    assert code == 1 and f"[data] threshold {float(value):g} must be strictly between 0 and 1 " \
        "(a probability: 0 predicts every label, 1 none)" in err, err
    assert not (tmp_path / "run").exists()


def test_a_misspelt_option_gets_its_commands_usage_and_the_nearest_name(capsys):
    """It got the top level's usage ("nlptrain [-h] [--version] COMMAND ...") and no hint."""
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--lrr", "1e-3"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "nlptrain train: error: unrecognized arguments: --lrr 1e-3 (did you mean --lr?)" in err
    assert err.startswith("usage: nlptrain train ")
    with pytest.raises(SystemExit):  # a list, kept off the command line: not --label-smoothing
        main(["train", "--labels", "neg,pos"])
    assert "unrecognized arguments: --labels neg,pos (a list, set in the task file or as --set " \
        "data.labels='[\"a\", \"b\"]')" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # predict has no --set: its labels are the model's
        main(["predict", "--model", "m", "--input", "x", "--labels", "a"])
    assert "--set" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    # A misspelt required option: it said only that --model was required.
    (["eval", "--modle", "m"], "nlptrain eval: error: unrecognized arguments: --modle m (did you "
                               "mean --model?)"),
    (["predict", "--model", "m", "--inptu", "f"], "nlptrain predict: error: unrecognized "
                                                  "arguments: --inptu f (did you mean --input?)"),
    (["eval"], "nlptrain eval: error: the following arguments are required: --model"),
    # A boolean's value typed: it was hinted from the flag's name (=true).
    (["eval", "--model", "m", "--group-by-length=false"], "(eval takes this task key as --set "
                                                          "train.group_by_length=false)"),
    # A command's option before it: argparse took 'debug' for the command.
    # An option before the command that the command does not take either: its nearest.
    (["--verbose", "train"], "nlptrain train: error: unrecognized arguments: --verbose"),
    (["-x", "train"], "nlptrain train: error: unrecognized arguments: -x"),
    (["--modle", "m", "eval"], "nlptrain eval: error: unrecognized arguments: --modle m (did "
                               "you mean --model?)"),
    (["--log-level", "debug", "train", "--epochs", "1"],
     "nlptrain: error: --log-level is an option of the command and goes after it: nlptrain "
     "train --log-level debug --epochs 1"),
])
def test_a_usage_error_names_the_option_at_fault(capsys, argv, said):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


def test_max_restarts_without_nproc_is_refused_not_ignored(capsys, toy_task, tmp_path):
    code, err = train(capsys, toy_task, tmp_path / "run", "--max-restarts", "2")
    assert code == 1 and "error: --max-restarts 2 restarts the workers --nproc N starts: give " \
        "--nproc" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_missing_data_file_is_one_error_before_any_worker_starts(capsys, toy_task, tmp_path,
                                                                  command):
    """Each of the --nproc workers said it ([rank 1] error: ..., then error: ...)."""
    argv = [command, "--task", str(toy_task), "--test-file", str(tmp_path / "nope.tsv"),
            "--nproc", "2"]
    argv += ["--output-dir", str(tmp_path / "run")] if command == "train" else ["--model", "m"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "nope.tsv" in err and "[rank" not in err, err
    assert "launched by" not in err and not (tmp_path / "run").exists()


def test_per_rank_files_start_without_the_train_file_they_were_split_from(toy_task, tmp_path):
    """The check before --nproc starts workers required [data] train, which such a run never
    reads (split, then the train file moved away: the README's way to hold the data once)."""
    from nlptrain.cli import build_parser, check_train
    from nlptrain.data.split import Manifest
    from nlptrain.errors import ConfigError, DataError

    parts = tmp_path / "parts"
    parts.mkdir()
    Manifest(2, [{"file": "part-0.jsonl", "rows": 1}, {"file": "part-1.jsonl", "rows": 1}],
             ["neg", "pos"]).save(parts)
    (toy_task.parent / "train.tsv").unlink()

    def check(shards: str, nproc: str) -> None:
        check_train(build_parser().parse_args(["train", "--task", str(toy_task), "--train-shards",
                                               shards, "--nproc", nproc]))

    check(str(parts), "2")  # no error: the train file is not needed
    # Their manifest before any worker starts (each rank said it, after ~20 s of start-up).
    with pytest.raises(ConfigError, match="the per-rank files were made for 2 ranks, but this "
                                          "job runs 3"):
        check(str(parts), "3")
    with pytest.raises(DataError, match=r"nope/manifest\.json: no manifest; make the per-rank files"):
        check(str(tmp_path / "nope"), "2")


def test_an_unexpected_error_is_raised_as_it_was_with_no_frame_of_the_error_mapping(monkeypatch):
    """A fault of a user's code (or of nlptrain's) keeps its traceback: cli.main raises it again,
    with no frame of command_end.py (which says timeouts and other ranks' failures) in it."""
    import traceback

    import nlptrain.plots as plots

    def broken(args):
        raise RuntimeError("a fault of some callback")

    monkeypatch.setattr(plots, "cmd_plot", broken)
    with pytest.raises(RuntimeError, match="a fault of some callback") as raised:
        main(["plot", "somewhere"])
    files = [frame.filename for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert not any(name.endswith("command_end.py") for name in files), files


def test_an_lr_of_zero_is_said_as_training_nothing(tiny_model_dir, caplog):
    """--lr 0 passed every check (not negative) and ran a whole training that changed nothing."""
    from transformers import AutoModelForSequenceClassification

    from nlptrain import TrainConfig, Trainer

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir))
    with caplog.at_level("WARNING", logger="nlptrain"):
        Trainer(model, config=TrainConfig(lr=0.0), progress=False)
        assert "lr 0: the optimizer's every parameter group has lr 0, so no weight will change" \
            in caplog.text
        caplog.clear()
        Trainer(model, config=TrainConfig(lr=1e-5), progress=False)
    assert "lr 0" not in caplog.text


def test_the_lr_check_takes_an_optimizer_whose_lr_is_not_a_number():
    """Adafactor's groups may hold lr None (a relative step): the check raised a TypeError
    when the trainer was built."""
    import torch

    from nlptrain.trainer_arguments import warn_if_the_lr_is_zero

    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(2)]  # (max() of 2)
    optimizer = torch.optim.SGD(groups, lr=0.1)
    for group in optimizer.param_groups:
        group["lr"] = None
    warn_if_the_lr_is_zero(optimizer)  # no error, nothing said
