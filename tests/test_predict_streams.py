"""`predict`'s input and output as a shell user meets them: standard input, a link, a device,
a full disk, a reader that stops early. Each is what the user asked for or one line, never a
traceback, and never a device or a link replaced by a plain file."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env, free_port

from nlptrain.cli import main


def predict(model: Path, *args: str) -> list[str]:
    return ["predict", "--model", str(model), *args]


def test_texts_come_from_standard_input_with_dash(tiny_model_dir: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"great film\nawful film\n")))
    assert main(predict(tiny_model_dir, "--input", "-")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[-1] for line in lines] == ["text", "great film", "awful film"]
    assert main(predict(tiny_model_dir, "--input", "-", "--nproc", "2")) == 1
    assert "--input -: a stream is read by one process; drop --nproc" in capsys.readouterr().err


def test_a_bad_row_on_standard_input_is_named_stdin_and_its_line(tiny_model_dir: Path, monkeypatch,
                                                                 capsys) -> None:
    """Standard input is read from a temporary copy: errors name stdin, not that copy's path."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"text": "ok"}\n{bad\n')))
    assert main(predict(tiny_model_dir, "--input", "-", "--input-format", "jsonl")) == 1
    err = capsys.readouterr().err
    assert "error: stdin:2: not valid JSON" in err and "nlptrain-input-" not in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(predict(tiny_model_dir, "--input", "-")) == 1
    assert "error: stdin: " in capsys.readouterr().err


def test_an_output_link_keeps_pointing_at_its_file_which_gets_the_predictions(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("good\nbad\n")
    (tmp_path / "target.tsv").write_text("old\n")
    (tmp_path / "link.tsv").symlink_to("target.tsv")
    assert main(predict(tiny_model_dir, "--input", str(tmp_path / "in.txt"),
                        "--output", str(tmp_path / "link.tsv"))) == 0
    assert (tmp_path / "link.tsv").is_symlink()
    assert len((tmp_path / "target.tsv").read_text().splitlines()) == 3  # header + 2 rows


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_devices_are_written_to_not_replaced_and_a_full_one_is_one_line(
        tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "in.txt").write_text("good\n")
    args = predict(tiny_model_dir, "--input", str(tmp_path / "in.txt"), "--format", "tsv")
    assert main([*args, "--output", "/dev/null"]) == 0
    assert main([*args, "--output", "/dev/full"]) == 1
    assert "error: /dev/full: the predictions cannot be written (No space left on device)" in \
        capsys.readouterr().err
    assert all(stat.S_ISCHR(os.stat(device).st_mode) for device in ("/dev/null", "/dev/full"))
    with open("/dev/full", "w") as full:  # stdout on a full disk
        done = subprocess.run([sys.executable, "-m", "nlptrain", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=child_env(), timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "error: stdout: the predictions cannot be written (No space left on device)" in done.stderr


def test_a_reader_that_stops_early_ends_predict_quietly(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`predict ... | head -1`: exit 141 as for SIGPIPE, and no BrokenPipeError traceback."""
    (tmp_path / "in.txt").write_text("".join(f"text {i}\n" for i in range(10_000)))
    command = [sys.executable, "-m", "nlptrain", *predict(tiny_model_dir, "--input",
                                                          str(tmp_path / "in.txt"))]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=child_env(), text=True) as child:
        assert child.stdout.readline().startswith("row\tline")
        child.stdout.close()  # the reader goes away
        err = child.stderr.read()
    assert child.returncode == 141 and "Traceback" not in err, err


def test_a_descriptor_the_nproc_workers_lack_is_refused_before_they_start(
        tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    """`predict --nproc 2 --output /dev/fd/9 9>out.tsv`: the workers (no fd 9 of theirs) scored
    every text, then failed to write (or wrote to a descriptor of their own numbered 9)."""
    (tmp_path / "in.txt").write_text("great film\n")
    with open(tmp_path / "out.tsv", "w") as out:
        fd, named = out.fileno(), f"/dev/fd/{out.fileno()}"
        assert main(predict(tiny_model_dir, "--input", str(tmp_path / "in.txt"), "--format", "tsv",
                            "--output", named, "--nproc", "2")) == 1
    assert f"--output {named}: descriptor {fd} does not reach the --nproc workers, which write " \
           "the predictions (they get stdout and stderr only): give a file's path, or drop " \
           "--nproc" in capsys.readouterr().err
    assert (tmp_path / "out.tsv").read_text() == ""


@pytest.mark.distributed
def test_a_descriptor_torchruns_workers_lack_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Under torchrun the check ran in the worker, whose descriptor of that number (if any) is
    its own: it passed or failed as that one was."""
    (tmp_path / "in.txt").write_text("great film\n")
    with open(tmp_path / "out.tsv", "w") as out:
        fd = out.fileno()
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
             "-m", "nlptrain", *predict(tiny_model_dir, "--input", str(tmp_path / "in.txt"),
                                        "--format", "tsv", "--output", f"/dev/fd/{fd}")],
            pass_fds=(fd,), env=child_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert f"--output /dev/fd/{fd}: descriptor {fd} does not reach the workers of torchrun" in done.stderr
    assert (tmp_path / "out.tsv").read_text() == ""


def test_a_descriptor_of_a_one_process_env_launch_is_written(tiny_model_dir: Path, tmp_path: Path) -> None:
    """RANK=0 WORLD_SIZE=1 set by hand (or an srun --pty shell): predict is still the shell's
    child and holds the descriptor, so it writes there."""
    (tmp_path / "in.txt").write_text("great film\n")
    with open(tmp_path / "out.tsv", "w") as out:
        fd = out.fileno()
        done = subprocess.run(
            [sys.executable, "-m", "nlptrain", *predict(tiny_model_dir, "--input", str(tmp_path / "in.txt"),
                                                        "--format", "tsv", "--output", f"/dev/fd/{fd}")],
            pass_fds=(fd,), env=child_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                          MASTER_PORT=str(free_port())),
            capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.tsv").read_text().splitlines()[1].endswith("\tgreat film")
