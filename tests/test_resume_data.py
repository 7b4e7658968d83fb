"""A resume may change no data: the files the run read, byte for byte, wherever they lie (a
data folder moved elsewhere is fine; files edited in place, or other files, are refused)."""

from __future__ import annotations

import json

import pytest

from nlptrain.cli import main


def test_a_resume_reading_another_data_folder_needs_the_run_s_own_files(tmp_path, caplog):
    """`--resume --data-dir OTHER` trained its last epochs on other files and tested the model on
    another test set, with no word: config.json alone said so. The same files moved resume."""
    from nlptrain.config import TaskConfig
    from nlptrain.errors import ConfigError
    from nlptrain.resume_checks import check_resume

    was, moved, other = (tmp_path / name for name in ("was", "moved", "other"))
    for folder, rows in ((was, "a fine film\tpos\n"), (moved, "a fine film\tpos\n"),
                         (other, "a dull film\tneg\n")):
        folder.mkdir()
        (folder / "train.tsv").write_text(f"text\tlabel\n{rows}", encoding="utf-8")
    task = TaskConfig(name="t", data_dir=str(was))
    task.data.train = "train.tsv"
    saved = {"task": task.to_dict()}
    check_resume(tmp_path, {**task.to_dict(), "data_dir": str(moved)}, saved)  # the same bytes
    with pytest.raises(ConfigError, match=rf"--data-dir {other}: its train.tsv is not the data the "
                                          rf"run read \({was / 'train.tsv'}\); a resume may change "
                                          rf"no data: resume with --data-dir {was}"):
        check_resume(tmp_path, {**task.to_dict(), "data_dir": str(other)}, saved)
    (was / "train.tsv").rename(tmp_path / "train.tsv")  # its files moved out, the folder kept
    check_resume(tmp_path, {**task.to_dict(), "data_dir": str(other)}, saved)
    assert f"the run read train.tsv in {was}, which no longer holds it; going on with the one " \
        f"in {other} (not compared)" in caplog.text
    was.rmdir()  # the run's folder is gone: nothing to compare with, said
    check_resume(tmp_path, {**task.to_dict(), "data_dir": str(other)}, saved)
    assert f"the run read its data in {was}, which is gone" in caplog.text


def test_a_resume_after_the_data_was_edited_in_place_is_refused(toy_task, tmp_path, capsys):
    """Only another --data-dir was compared: rows appended to train.tsv where it lay were taken,
    the held-out split drawn again from them (trained rows among the validation ones) (review
    121). The run records each file's digest; the same bytes, moved, still resume."""
    import shutil

    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
            "--valid-size", "0.1"]
    assert main(args) == 0
    recorded = json.loads((run / "config.json").read_text())["data_digests"]
    assert set(recorded) == {"train.tsv", "test.tsv"}
    moved = tmp_path / "moved"
    shutil.copytree(toy_task.parent, moved, ignore=shutil.ignore_patterns("cache", "run"))
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "2", "--data-dir",
                 str(moved), "--max-steps", "19"]) == 0
    with open(moved / "train.tsv", "a", encoding="utf-8") as train_file:
        train_file.write("one more good film\tpos\n")
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "2", "--data-dir",
                 str(moved)]) == 1
    err = capsys.readouterr().err
    assert f"train.tsv in {moved} is not the data the run read (its bytes have changed since); a " \
        "resume may change no data" in err, err


def test_the_train_file_that_per_rank_files_replace_is_not_recorded(tmp_path):
    """The run never reads the split's source file: an edit of it refused the resume, and every
    start hashed it, the big file splitting exists to avoid (review 124)."""
    from nlptrain.config import TaskConfig
    from nlptrain.resume_checks import data_digests

    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "manifest.json").write_text('{"labels": ["pos"]}')
    (tmp_path / "train.tsv").write_text("text\tlabel\na film\tpos\n")
    task = TaskConfig(name="t", data_dir=str(tmp_path))
    task.data.train, task.data.train_shards = "train.tsv", "parts"
    assert data_digests(task.to_dict(), "t.toml") == {}  # (the parts: their own check, by part)


def test_a_resume_reading_other_per_rank_files_is_refused(tmp_path):
    """train_shards in another --data-dir, of other rows: only 'split again since the checkpoint'
    was said, and the run trained on them."""
    from nlptrain.config import TaskConfig
    from nlptrain.errors import ConfigError
    from nlptrain.resume_checks import check_resume

    for name, label in (("was", "pos"), ("other", "neg")):
        (tmp_path / name / "parts").mkdir(parents=True)
        (tmp_path / name / "parts" / "manifest.json").write_text(f'{{"labels": ["{label}"]}}')
    task = TaskConfig(name="t", data_dir=str(tmp_path / "was"))
    task.data.train_shards = "parts"
    with pytest.raises(ConfigError, match=r"its parts is not the data the run read"):
        check_resume(tmp_path, {**task.to_dict(), "data_dir": str(tmp_path / "other")},
                     {"task": task.to_dict()})
