"""A short real run leaves a complete, readable run directory (issue 7)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from log_capture import nlptrain_messages
from PIL import Image

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, str]:
    """One 2-epoch run in the default run directory (runs/<task>-<time>), with a validation split."""
    from conftest import write_toy_task

    work = tmp_path_factory.mktemp("rundir")
    write_toy_task(work, tiny_model_dir)  # no cache_dir, no output dir: the defaults
    args = ["train", "--task", "toy.toml", "--valid-size", "0.2", "--log-every", "2"]
    done = run_cli(args + (["--tensorboard"] if HAS_TENSORBOARD else []), cwd=work)
    assert done.returncode == 0, done.stderr
    runs = list((work / "runs").glob("toy-*"))
    assert len(runs) == 1, runs
    return runs[0], done.stderr


def test_config_records_the_resolved_task_world_and_versions(finished_run: tuple[Path, str]) -> None:
    run, _ = finished_run
    config = json.loads((run / "config.json").read_text())
    assert config["task"]["data"]["valid_size"] == 0.2  # the override, not the file's 0.0
    assert config["task"]["train"]["log_every"] == 2
    assert config["world_size"] == 1
    assert set(config["versions"]) == {"nlptrain", "torch", "transformers"}
    assert "git_commit" in config


def test_metrics_hold_training_and_eval_rows(finished_run: tuple[Path, str]) -> None:
    run, _ = finished_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in train] == list(range(2, 33, 2))  # 16 steps an epoch, every 2nd
    for row in train:
        assert {"step", "epoch", "loss", "lr", "samples_per_s", "grad_norm"} <= set(row)
        assert row["samples_per_s"] > 0 and row["grad_norm"] > 0  # clipping is on by default
    assert [(r["epoch"], r["step"]) for r in evals] == [(1, 16), (2, 32)]
    assert {"accuracy", "macro_f1", "per_class", "confusion_matrix", "is_best"} <= set(evals[0])


def test_checkpoints_best_and_model_are_loadable_hf_folders(finished_run: tuple[Path, str]) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run, _ = finished_run
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000016",
                                                                        "step-00000032"]
    for folder in ("best", "model"):
        model = AutoModelForSequenceClassification.from_pretrained(run / folder)
        assert model.config.id2label == {0: "neg", 1: "pos"}
        assert AutoTokenizer.from_pretrained(run / folder)("a good film")["input_ids"]


def test_results_report_and_plots(finished_run: tuple[Path, str]) -> None:
    run, _ = finished_run
    results = json.loads((run / "results.json").read_text())
    assert results["data"] == {"train": {"rows": 128, "source": "train.tsv (less the held-out rows)"},
                               "valid": {"rows": 32,
                                         "source": "20% of the rest of train (stratified, seed 42)"},
                               "test": {"rows": 40, "source": "test.tsv"}}
    report = (run / "report.md").read_text()
    for part in ("# Run report: toy", "## Data", "## Settings", "| lr | 0.001 |", "## Results",
                 "best on validation", "last on validation", "test, the best model",
                 "### Per class (test)", "### Confusion matrix (test", "processes: 1"):
        assert part in report, part
    test = results["test"]
    assert f"| neg | {test['per_class']['neg']['precision']:.4f} |" in report
    links = [line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")]
    assert links == ["plots/training.png", "plots/evaluation.png", "plots/confusion_matrix.png"]
    for link in links:
        with Image.open(run / link) as image:
            image.verify()
        with Image.open(run / link) as image:
            assert image.format == "PNG"
            sizes = {"training": (900, 840),  # a third panel: grad_norm (clipping is on by default)
                     "evaluation": (900, 600), "confusion_matrix": (700, 600)}
            assert image.size == sizes[Path(link).stem]


def test_tensorboard_events_when_installed(finished_run: tuple[Path, str]) -> None:
    run, _ = finished_run
    if not HAS_TENSORBOARD:
        assert not (run / "tensorboard").exists()
        pytest.skip("tensorboard is not installed (the 'absent' path is tested below)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/lr", "eval/accuracy", "eval/macro_f1"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("eval/accuracy")] == [16, 32]


def test_the_log_is_quiet(finished_run: tuple[Path, str]) -> None:
    """Rank 0 logs the run in plain lines; no warnings a user cannot act on."""
    run, stderr = finished_run
    assert f"run directory: {run.relative_to(run.parents[1])}" in stderr
    for noise in ("Warning", "warn(", "Traceback", "Writing model shards", "[rank", "warning:"):
        assert noise not in stderr, noise
    last = stderr.splitlines()[-1]  # what it leaves on disk, measured
    size = sum(f.stat().st_size for f in run.rglob("*") if f.is_file()) / 2**20
    assert last.startswith(f"{run.relative_to(run.parents[1])}: {size:.0f} MB, of which "
                           "checkpoints/ "), last


def test_tensorboard_absent_is_a_warning_not_an_error(monkeypatch: pytest.MonkeyPatch,
                                                      toy_task: Path, tmp_path: Path) -> None:
    """Without the tensorboard package, `--tensorboard` only warns and the run completes."""
    from nlptrain import recipe
    from nlptrain.cli import build_parser, resolve_task
    from nlptrain.distributed import SingleProcess

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    with nlptrain_messages() as messages:
        args = build_parser().parse_args(["train", "--task", str(toy_task), "--epochs", "1",
                                          "--tensorboard"])
        task = resolve_task(args)
        opts = recipe.RunOptions(output_dir=str(tmp_path / "run"), tensorboard=args.tensorboard)
        results = recipe.train(task, opts, SingleProcess())
    assert results["test"]["rows"] == 40
    assert any("tensorboard package is not installed" in m for m in messages), messages
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert (tmp_path / "run" / "report.md").is_file()


def test_model_card_follows_the_hub_convention_and_lists_every_metric(
        finished_run: tuple[Path, str]) -> None:
    run, _ = finished_run
    card = (run / "model" / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert front.splitlines()[:3] == ["library_name: transformers",
                                      "pipeline_tag: text-classification", "tags:"]
    assert "- toy" in front.splitlines()
    results = json.loads((run / "results.json").read_text())
    for split in ("valid", "test"):
        assert f"| {split} | {results['data'][split]['rows']} |" in body
    assert "| metric | validation | test |" in body
    for name in ("accuracy", "macro_f1", "loss"):
        row = f"| {name} | {results['valid'][name]:.4f} | {results['test'][name]:.4f} |"
        assert row in body
    assert "`0`: neg, `1`: pos" in body and "| lr | 0.001 |" in body
    assert "| metric_for_best | accuracy (the kind's) |" in body and "max_steps" not in body
    assert 'pipeline("text-classification", model=' in body


def test_the_settings_say_the_metric_that_picked_the_model_and_a_max_steps_cut() -> None:
    from nlptrain.report import train_settings

    def run(kind: str, **train) -> dict:
        return {"task": {"data": {"kind": kind}, "train": {"epochs": 3, **train}}}

    settings = train_settings(run("regression", metric_for_best="", max_steps=0))
    assert settings["metric_for_best"] == "pearson (the kind's)" and "max_steps" not in settings
    settings = train_settings(run("single_label", metric_for_best="macro_f1", max_steps=320))
    assert (settings["metric_for_best"], settings["max_steps"]) == ("macro_f1", 320)


def test_model_card_says_the_encoder_was_cut_to_its_first_layers(tmp_path: Path) -> None:
    from nlptrain.model_card import model_card

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    task = {"name": "t", "model": {"name": "base", "max_length": 64, "num_hidden_layers": 3}}
    (tmp_path / "config.json").write_text(json.dumps({"task": task}))
    assert "(bert, its first 3 encoder layers, max length 64 tokens)" in model_card(tmp_path)
    task["model"]["num_hidden_layers"] = 0  # all of them: nothing to say
    (tmp_path / "config.json").write_text(json.dumps({"task": task}))
    assert "(bert, max length 64 tokens)" in model_card(tmp_path)


def test_model_card_metrics_table_takes_any_scalar_metric() -> None:
    from nlptrain.model_card import metrics_table

    results = {"valid": {"pearson": 0.91, "spearman": 0.9, "rows": 10, "per_class": {}},
               "test": {"mcc": 0.5, "pearson": 0.8, "confusion_matrix": [[1]]}}
    assert metrics_table(results) == ["| metric | validation | test |", "| --- | ---: | ---: |",
                                      "| pearson | 0.9100 | 0.8000 |", "| spearman | 0.9000 |  |",
                                      "| mcc |  | 0.5000 |"]


def test_a_resume_may_change_the_plan_and_the_lr_but_not_the_groups(tmp_path: Path) -> None:
    """epochs, cadences, patience, the lr and its schedule may change on resume (the run goes on
    with them); layer_lr_decay makes other parameter groups, which the checkpoint's optimizer
    state cannot load into, and the data order is the one the resume skips into, so a change
    of either is refused."""
    import copy

    from nlptrain.config import TaskConfig
    from nlptrain.errors import ConfigError
    from nlptrain.runs import prepare_run_dir

    task, folder = TaskConfig(name="toy").to_dict(), tmp_path / "run"
    assert not prepare_run_dir(folder, task, 1, resume=False, overwrite=False)
    later = copy.deepcopy(task)
    later["train"].update(epochs=5, eval_every=3, checkpoint_every=2, keep_checkpoints=4,
                          early_stopping=2, log_every=1, lr=1e-5, scale_lr=True, weight_decay=0.0,
                          scheduler="cosine", warmup_ratio=0.2)
    assert prepare_run_dir(folder, later, 2, resume=True, overwrite=False)
    changed = copy.deepcopy(task)
    changed["train"]["layer_lr_decay"] = 0.9
    with pytest.raises(ConfigError, match="optimizer parameter groups, and these changed: "
                                          "layer_lr_decay 1.0 -> 0.9"):
        prepare_run_dir(folder, changed, 1, resume=True, overwrite=False)
    # The order the resume skips into: another would train some rows twice and others never.
    for key, value in {"seed": 7, "batch_size": 4, "max_tokens": 256, "group_by_length": False,
                       "grad_accum": 4}.items():
        changed = copy.deepcopy(task)
        changed["train"][key] = value
        harm = "first step after it would sum" if key == "grad_accum" else "rows would be trained"
        with pytest.raises(ConfigError, match=f"data order, and these changed: {key} .*{harm}"):
            prepare_run_dir(folder, changed, 1, resume=True, overwrite=False)
    # The padded widths plan a token budget's batches, and only those; batch_size plans only
    # batches of rows (a change of it under a budget was refused as harmful).
    budget = copy.deepcopy(task)
    budget["train"]["max_tokens"] = 256
    budgeted = tmp_path / "budgeted"
    assert not prepare_run_dir(budgeted, budget, 1, resume=False, overwrite=False)
    for key, value in {"pad_to_multiple_of": 1, "padding": "max_length", "batch_size": 4}.items():
        for run, train in ((folder, task["train"]), (budgeted, budget["train"])):
            changed = copy.deepcopy(task)
            changed["train"] = {**train, key: value}
            plans = (key in ("pad_to_multiple_of", "padding")) == bool(train.get("max_tokens"))
            if plans:
                with pytest.raises(ConfigError, match=f"data order, and these changed: {key} "):
                    prepare_run_dir(run, changed, 1, resume=True, overwrite=False)
            else:
                assert prepare_run_dir(run, changed, 1, resume=True, overwrite=False)


def test_runs_started_in_the_same_second_get_folders_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep or a SLURM array starts runs in the same second: each makes its own folder, and
    --overwrite or --resume never act on a generated name (another run's)."""
    import time

    from nlptrain import recipe
    from nlptrain.config import TaskConfig
    from nlptrain.distributed import SingleProcess

    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda fmt, *when: "20260101-120000"
                        if fmt == "%Y%m%d-%H%M%S" else real(fmt, *when))
    monkeypatch.chdir(tmp_path)
    task, dist = TaskConfig(name="toy"), SingleProcess()
    with contextlib.ExitStack() as held:  # each run holds its folder while it runs
        made = [held.enter_context(recipe.open_run_dir(task, opts, dist)) for opts in (
            recipe.RunOptions(), recipe.RunOptions(overwrite=True), recipe.RunOptions(resume=True))]
    assert [(folder.name, has_run) for folder, has_run, _ in made] == [
        ("toy-20260101-120000", False), ("toy-20260101-120000-2", False),
        ("toy-20260101-120000-3", False)]
    assert all((folder / "config.json").is_file() for folder, _, _ in made)


def test_resume_without_output_dir_says_a_new_run_starts(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`--resume` acts only on an --output-dir; without one the user is told, not left to find
    a second run directory."""
    from nlptrain import recipe
    from nlptrain.config import TaskConfig
    from nlptrain.distributed import SingleProcess

    monkeypatch.chdir(tmp_path)
    with nlptrain_messages() as messages:
        with recipe.open_run_dir(TaskConfig(name="toy"), recipe.RunOptions(resume=True),
                                 SingleProcess()) as (folder, has_run, _):
            pass
    assert not has_run
    assert any(f"--resume without --output-dir: a new run starts in {folder}" in m
               for m in messages), messages


@pytest.mark.parametrize(("extra", "said"), [
    (["--grad-accum", "2"], ("batch 8 per process x 2 accumulated, 16 per optimizer step",
                             "processes: 1 (global batch 16 per optimizer step)")),
    (["--max-tokens", "256"], ("batches of up to 256 tokens per process",
                               "processes: 1 (batches of up to 256 tokens per process)"))])
def test_the_log_and_report_state_the_global_batch(toy_task: Path, tmp_path: Path, capsys, extra,
                                                   said) -> None:
    from nlptrain.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                 "--steps-per-epoch", "1", *extra]) == 0
    logged, reported = said
    assert re.search(rf"1 process\(es\) on \S+: {re.escape(logged)}\n", capsys.readouterr().err)
    assert reported in (run / "report.md").read_text()
    # No validation set: the evaluations score the test set, which picks no best model.
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert evals and not any("is_best" in row for row in evals)


def test_the_report_and_model_card_count_the_processes_a_resume_ran_with(toy_task: Path,
                                                                          tmp_path: Path) -> None:
    """They read config.json's first world size: a run resumed on 2 processes for most of its
    steps was said to have run on 1, at the first one's global batch."""
    from nlptrain.cli import main
    from nlptrain.model_card import model_card
    from nlptrain.report import report_markdown

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                 "--steps-per-epoch", "1"]) == 0
    config = json.loads((run / "config.json").read_text())
    config["resumes"] = [{"world_size": 2}, {"world_size": 2}]  # as two resumes on 2 record it
    (run / "config.json").write_text(json.dumps(config))
    assert "processes: 1, then 2 (resumed) (global batch 16 per optimizer step)" in report_markdown(run)
    assert "with 1, then 2 (resumed) process(es)" in model_card(run)


def test_a_run_shorter_than_log_every_without_evaluation_ends_well(toy_task: Path,
                                                                    tmp_path: Path) -> None:
    """No validation or test set and fewer steps than log_every: the run's end is still logged,
    so its plots and report are made and the run ends with 0 (it used to end with 1)."""
    from nlptrain.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                 "--steps-per-epoch", "3", "--test-file", "", "--test-size", "0"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"], r["closing"]) for r in rows] == [("train", 3, True)]
    assert (run / "plots" / "training.png").is_file() and (run / "report.md").is_file()


def test_only_a_run_that_wrote_nothing_but_its_config_is_forgotten(tmp_path: Path) -> None:
    from nlptrain.runs import forget_unstarted_run

    for name in ("made", "given", "trained"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / ".lock").write_text("pid 1")
    (tmp_path / "trained" / "metrics.jsonl").write_text("{}\n")  # it trained: what it logged stays
    assert forget_unstarted_run(tmp_path / "made", made_here=True)
    assert not (tmp_path / "made").exists()
    assert forget_unstarted_run(tmp_path / "given", made_here=False)  # the user's folder stays
    assert [p.name for p in (tmp_path / "given").iterdir()] == [".lock"]
    assert not forget_unstarted_run(tmp_path / "trained", made_here=True)
    assert sorted(p.name for p in (tmp_path / "trained").iterdir()) == [".lock", "config.json",
                                                                         "metrics.jsonl"]


def test_ctrl_c_names_the_folder_a_run_goes_on_from_and_none_where_nothing_was_written(
        toy_task, tmp_path, capsys, monkeypatch):
    """A second Ctrl-C in a run in a generated folder names that folder; one while the data is
    read (no run yet) says to start again, not to resume a folder that does not exist."""
    from nlptrain import recipe
    from nlptrain.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AT_STEP", "8")
    scaffold = str(Path(__file__).parent / "scaffold_callbacks.py")
    args = ["train", "--task", str(toy_task), "--checkpoint-every", "3"]
    assert main([*args, "--callback", f"{scaffold}:SecondCtrlCAtStep"]) == 130
    said = capsys.readouterr().err
    named = re.search(r"train --resume --output-dir (\S+)", said)
    assert named and Path(named[1]).parent == Path("runs"), said
    assert (Path(named[1]) / "checkpoints" / "step-00000006").is_dir()
    assert main([*args, "--resume", "--output-dir", named[1]]) == 0

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "build_datasets", interrupted)
    assert main([*args, "--output-dir", "fresh"]) == 130
    said = capsys.readouterr().err
    assert "run the same command again" in said and "--resume" not in said, said
    assert not Path("fresh").exists()


def test_model_card_shows_what_the_pipeline_returns_and_no_picking_metric_without_validation(
        tmp_path: Path) -> None:
    """transformers' pipeline returns a dict for a pair (a dict), a list of one for a text; a run
    without a validation set picked no model, so no metric_for_best is listed for it."""
    from nlptrain.model_card import model_card

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(
        {"model_type": "bert", "id2label": {"0": "no", "1": "yes"}}))
    task = {"name": "t", "data": {"text_pair_column": "hypothesis"},
            "train": {"epochs": 1, "metric_for_best": ""}}
    (tmp_path / "config.json").write_text(json.dumps({"task": task}))
    (tmp_path / "results.json").write_text(json.dumps({"test": {"accuracy": 0.5}}))
    card = model_card(tmp_path)
    assert '"text_pair": "second sentence"}, truncation=True)   # {"label": "no", "score": ...}' in card
    assert "metric_for_best" not in card
    task["data"]["text_pair_column"] = ""
    (tmp_path / "config.json").write_text(json.dumps({"task": task}))
    (tmp_path / "results.json").write_text(json.dumps({"valid": {"accuracy": 0.5}}))
    card = model_card(tmp_path)
    assert 'classify("a text to classify", truncation=True)   # [{"label": "no", "score": ...}]' in card
    assert "| metric_for_best | accuracy (the kind's) |" in card
