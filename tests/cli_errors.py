"""Helpers of the bad-input tests: `nlptrain train` run in this process, its stderr read back,
and a task file edited in place."""

from __future__ import annotations

from pathlib import Path

from nlptrain.cli import main


def train(capsys, task: Path, run_dir: Path, *extra: str) -> tuple[int, str]:
    code = main(["train", "--task", str(task), "--output-dir", str(run_dir), *extra])
    return code, capsys.readouterr().err


def edit(task: Path, old: str, new: str) -> Path:
    text = task.read_text()
    assert old in text
    task.write_text(text.replace(old, new))
    return task
