"""Errors that every rank of a machine meets alike (a cache folder, a model folder, an option the
model refuses) are said once a machine under --nproc, by its local rank 0; a process's own
failure (out of descriptors, an I/O error) by the rank it hit (real launches of the toy task,
gloo on loopback)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import TWO_RANK_TRAIN, child_env

from nlptrain.errors import ConfigError


@pytest.mark.distributed
def test_a_cache_folder_every_rank_of_the_machine_fails_on_is_said_once(toy_folder, tmp_path):
    """Its error was printed by each rank of the machine; the launcher then named rank 0 as
    "ended by SIGTERM" when the quiet rank left first and the agent stopped rank 0 leaving."""
    (tmp_path / "a file").write_text("")
    out = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--nproc", "2",
                          "--output-dir", str(tmp_path / "run"), "--cache-dir",
                          str(tmp_path / "a file" / "cache")], cwd=toy_folder, env=child_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.count("cannot be written (Not a directory)") == 1, out.stderr[-3000:]
    assert out.stderr.rstrip().endswith("error: rank 0 of 2 failed (exit code 1); its error is above")


@pytest.mark.distributed
@pytest.mark.parametrize("option, said", [
    (["--model", "no-such-folder"], "no-such-folder: no model here (no config.json)"),
    (["--max-length", "2"], "max_length 2 leaves no room for the text")], ids=["model", "max_length"])
def test_a_model_folder_or_option_every_rank_reads_alike_is_said_once(toy_folder, tmp_path, option,
                                                                     said):
    """Review 99: each rank said it, sometimes on one line ('...(minilm)[rank 1] error: ...')."""
    out = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--nproc", "2",
                          "--output-dir", str(tmp_path / "run"), *option], cwd=toy_folder,
                         env=child_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 1 and out.stderr.count(said) == 1, out.stderr[-3000:]
    assert "[rank 1]" not in out.stderr, out.stderr[-3000:]



@pytest.mark.parametrize(("cause", "every_rank_of_the_machine"), [
    (OSError("model does not appear to have a file named model.safetensors"), True),
    (FileNotFoundError(2, "No such file or directory"), True),
    (ValueError("unknown model_type"), True),
    (OSError(1, "Operation not permitted"), True),
    (OSError(24, "Too many open files"), False),  # this process's own
    (OSError(5, "Input/output error"), False),
    (OSError("No such device (os error 19)"), False)])  # safetensors' form (review 101)
def test_a_model_folders_error_is_said_once_a_machine_but_a_process_failure_by_its_rank(
        tmp_path, tiny_model_dir, monkeypatch, cause, every_rank_of_the_machine):
    """Review 100: an ENOMEM on rank 1 alone was left to local rank 0, which never had it: said by
    no rank (under --nproc, every rank of the machine would read the folder's content alike)."""
    import transformers

    from nlptrain.models import classifier_from_folder

    def failing(*args, **kwargs):
        raise cause
    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", failing)
    with pytest.raises(ConfigError, match="cannot load a text classifier from it") as raised:
        classifier_from_folder(tiny_model_dir)
    assert raised.value.raised_on_every_local_rank is every_rank_of_the_machine
