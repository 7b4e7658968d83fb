"""Durable writes: the staged data are fsynced before the rename, the folder after it, and a crash
before the rename leaves the old file or folder whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nlptrain import durable


@pytest.fixture()
def fsynced(monkeypatch) -> list[str]:
    """The paths os.fsync was called on, in order."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", spy)
    return seen


def crash_on_rename(monkeypatch, source_name: str) -> None:
    """os.replace raises when it would move `source_name` into place: a crash at that moment."""
    real = os.replace

    def replace(src, dst) -> None:
        if Path(src).name == source_name:
            raise OSError("power lost")
        real(src, dst)

    monkeypatch.setattr(durable.os, "replace", replace)


def test_a_file_is_fsynced_before_the_rename_and_its_folder_after(tmp_path, fsynced):
    target = tmp_path / "results.json"
    durable.write_text(target, '{"accuracy": 1.0}')
    assert target.read_text() == '{"accuracy": 1.0}'
    assert fsynced == [str(tmp_path / ".results.json.tmp"), str(tmp_path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_crash_before_the_rename_leaves_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    target.write_text("old")
    crash_on_rename(monkeypatch, ".config.json.tmp")
    with pytest.raises(OSError, match="power lost"):
        durable.write_text(target, "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no staging left


def staged_folder(parent: Path, name: str, text: str) -> Path:
    folder = parent / name
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_text(text)
    (folder / "sub" / "part").write_text(text)
    return folder


def test_a_folder_has_every_file_and_folder_fsynced_then_its_parent(tmp_path, fsynced):
    staging = staged_folder(tmp_path, ".tmp-model", "new")
    target = staged_folder(tmp_path, "model", "old")
    durable.replace_folder(staging, target)
    assert (target / "model.safetensors").read_text() == "new"
    assert sorted(fsynced[:-1]) == sorted(str(staging / p) for p in
                                          ("model.safetensors", "sub/part", "sub", "."))
    assert fsynced[-1] == str(tmp_path)  # the rename itself, last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_crash_before_a_folder_rename_leaves_the_old_folder_whole(tmp_path, monkeypatch):
    staging = staged_folder(tmp_path, ".tmp-model", "new")
    target = staged_folder(tmp_path, "model", "old")
    crash_on_rename(monkeypatch, ".tmp-model")
    with pytest.raises(OSError, match="power lost"):
        durable.replace_folder(staging, target)
    assert (target / "model.safetensors").read_text() == "old"
    assert (target / "sub" / "part").read_text() == "old"


def test_clear_leftovers_removes_half_writes_and_puts_back_a_folder_moved_aside(tmp_path: Path):
    """What writers that died mid-write leave: staging is removed; `.old-NAME` is removed where
    NAME is in place, else it is put back (the crash fell between the two renames)."""
    (tmp_path / ".tmp-step-00000004" / "shards").mkdir(parents=True)
    (tmp_path / ".config.json.tmp").write_text("{")
    for name in ("step-00000002", ".old-step-00000002", ".old-model"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text(name)
    assert durable.clear_leftovers(tmp_path) == [".config.json.tmp", ".old-model",
                                                 ".old-step-00000002", ".tmp-step-00000004"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "step-00000002"]
    assert (tmp_path / "model" / "weights").read_text() == ".old-model"  # put back
    assert (tmp_path / "step-00000002" / "weights").read_text() == "step-00000002"  # kept
    assert durable.clear_leftovers(tmp_path / "absent") == []


def test_a_run_file_a_full_disk_stops_is_one_line_with_what_to_do(toy_task, tmp_path, capsys,
                                                                  monkeypatch):
    """results.json, predictions, plots, report, config.json: a full disk was a 40-line
    traceback (with matplotlib's, an AttributeError raised while handling it)."""
    import errno

    import nlptrain.recipe
    from nlptrain.cli import main

    def full_disk(run_dir, *args):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "plots" / "a.png"))
        except OSError:  # (raised while handling it: "During handling of the above ...")
            raise AttributeError("'_idat' object has no attribute 'fileno'")  # noqa: B904

    monkeypatch.setattr(nlptrain.recipe, "write_outputs", full_disk)
    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--max-steps", "2"]) == 1
    err = capsys.readouterr().err
    assert f"error: {run / 'plots' / 'a.png'}: cannot be written (No space left on device, " in err
    assert f"what was trained is kept: free space, then train --resume --output-dir {run}" in err
    assert "Traceback" not in err, err


def test_metrics_rows_a_full_disk_keeps_out_are_said_once(tmp_path, caplog):
    from nlptrain.callbacks import MetricLogger

    class Full:  # a row buffered, its flush refused; closing would flush it again
        def write(self, text):
            pass

        def flush(self):
            raise OSError(28, "No space left on device")

        close = flush

    logger = MetricLogger(tmp_path / "metrics.jsonl")
    logger.handle = Full()
    with caplog.at_level("WARNING", logger="nlptrain"):
        logger._write({"step": 1})
        logger.handle = Full()
        logger._write({"step": 2})
        logger.handle = Full()
    assert caplog.text.count("a row cannot be written (No space left on device)") == 1
    assert logger.unwritten == 2
    logger._write({"step": 3})  # its buffer dropped: the run's end closes no unwritten row
    logger.on_train_end(None)  # (it raised the close's OSError, a traceback at the run's end)
    assert logger.handle is None

    class Folder:  # not a full disk: an error, as before (rows lost with exit 0 otherwise)
        def write(self, text):
            raise IsADirectoryError(21, "Is a directory")

    logger.handle = Folder()
    with pytest.raises(IsADirectoryError):
        logger._write({"step": 3})


def test_a_checkpoints_own_line_on_a_full_disk_is_not_renamed(tmp_path):
    """Its CheckpointError (what was saved before it is kept) was taken for a run file's, from
    the OSError it had hidden ('what was trained is kept', naming a staging file)."""
    from nlptrain.errors import CheckpointError
    from nlptrain.runs import out_of_space_said

    with pytest.raises(CheckpointError, match="what was saved before it is kept"):
        with out_of_space_said(tmp_path):
            try:
                raise OSError(28, "No space left on device", str(tmp_path / ".tmp-step-1" / "meta.json"))
            except OSError:
                raise CheckpointError("step-1: cannot be written; what was saved before it is kept") from None


def test_a_model_a_full_disk_stops_names_the_resume_that_finishes_the_run(toy_task, tmp_path,
                                                                          capsys, monkeypatch):
    """The export's line said what was kept but not how to go on; that resume trains nothing
    again and writes the model."""
    import errno

    import nlptrain.checkpoint
    from nlptrain.cli import main

    def full_disk(tokenizer, folder, max_length):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "tokenizer.json"))

    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--max-steps", "2"]
    with monkeypatch.context() as patch:
        patch.setattr(nlptrain.checkpoint, "save_tokenizer", full_disk)
        assert main(args) == 1
    err = capsys.readouterr().err
    assert f"error: {run / 'model'}: cannot be written (No space left on device)" in err
    assert ("what was saved before it is kept: once it can be written, train --resume "
            f"--output-dir {run}") in err
    assert not (run / "model").exists()
    assert main([*args, "--resume"]) == 0
    assert "nothing left to train" in capsys.readouterr().err
    assert (run / "model" / "tokenizer.json").is_file()


def test_torch_saves_own_error_on_a_full_disk_is_said_as_such(tmp_path):
    """torch.save's ENOSPC is a RuntimeError of its C++ writer's ('unexpected pos 18816 vs
    18708'), which the line showed as the reason."""
    from nlptrain.checkpoint import writing
    from nlptrain.errors import CheckpointWriteError

    with pytest.raises(CheckpointWriteError, match=r"step-1: cannot be written \(torch\.save wrote "
                                                   r"it short: the disk or quota is full\); "):
        with writing(tmp_path / "step-1"):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 18816 "
                               "vs 18708")
    assert not (tmp_path / "step-1").exists()


def test_a_full_disk_at_the_run_folders_lock_is_one_line(tmp_path, monkeypatch):
    """It was a traceback from the lock file's flush, and the empty lock file stayed."""
    import errno

    import nlptrain.runs
    from nlptrain.errors import ConfigError

    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)

        class Full:
            def __getattr__(self, name):
                return getattr(handle, name)

            def flush(self):
                raise OSError(errno.ENOSPC, "No space left on device")

        return Full()

    monkeypatch.setattr(nlptrain.runs, "open", full_open, raising=False)
    lock = nlptrain.runs.RunDirLock()
    with pytest.raises(ConfigError, match=r"\.lock: cannot be written \(No space left on device, "
                                          r"\d+ MB free on its disk\); free space, or pick another "
                                          r"--output-dir$"):
        lock.acquire(tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []


def test_a_full_disk_before_anything_trained_says_to_start_again(toy_task, tmp_path, capsys,
                                                                 monkeypatch):
    """The run's folder goes (it holds nothing to resume): a --resume would find no run."""
    import errno

    import nlptrain.recipe
    from nlptrain.cli import main

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "x"))

    monkeypatch.setattr(nlptrain.recipe, "log_sizes", full_disk)
    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--max-steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "cannot be written (No space left on device, " in err
    assert "nothing was trained yet: free space, then run the same command again" in err, err
    assert "--resume" not in err and not run.exists()


def test_a_row_a_full_disk_cut_short_is_ended_before_the_next(tmp_path):
    """The next row was appended to the torn one: both lost, the second not counted."""
    from nlptrain.callbacks import MetricLogger

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    MetricLogger(path)._write({"step": 3})
    assert path.read_text().splitlines()[1:] == ['{"step": 2, "lo', '{"step": 3}']
