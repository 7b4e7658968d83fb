"""An install that is not the checkout (a wheel, `pip install .`) holds what the shipped tasks need."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PACKAGED = ("setup.cfg", "pyproject.toml", "README.md", "nlptrain", "callbacks", "tasks", "data")
FIND = """
import sys
# The install alone: the checkout's editable finder would lend it a subpackage it lacks.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable")]
import nlptrain.cli, nlptrain.trainer, nlptrain.predict, nlptrain.callbacks  # every subpackage
from nlptrain.task_options import find_task
from nlptrain.config import file_spec
from nlptrain.task_files import load_task
from pathlib import Path
task = load_task(find_task("default"))
for which in ("train", "test"):
    path = Path(task.data_dir) / file_spec(task, which).path
    print(which, path, path.is_file())
"""


def test_the_default_tasks_data_is_installed_where_the_task_looks(tmp_path: Path) -> None:
    """`python -m nlptrain train` (the default task) reads data/sentiment, also from an install
    that is not the checkout: it used to say "train file not found" in site-packages."""
    source, target = tmp_path / "source", tmp_path / "site"
    source.mkdir()
    for name in PACKAGED:  # a copy: the build leaves its build/ there, not in the checkout
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns(
            "__pycache__", ".nlptrain_cache")} if (REPO / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)], check=True, capture_output=True)
    found = subprocess.run([sys.executable, "-c", FIND], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                           capture_output=True, text=True, check=True).stdout.split("\n")
    assert [line.split()[0] for line in found if line] == ["train", "test"]
    for line in filter(None, found):
        _, path, exists = line.split()
        assert Path(path).is_relative_to(target) and exists == "True", line
