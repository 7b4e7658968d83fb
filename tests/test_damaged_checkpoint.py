"""A damaged checkpoint is found before anything is loaded, named in one line, and skipped for the
newest whole one: in one process, and on 2 ranks restarted by torchrun --max-restarts."""

from __future__ import annotations

import json
import resource
import signal
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from toy_trainer import make_trainer

from nlptrain.checkpoint import list_checkpoints, prune_checkpoints, save_checkpoint
from nlptrain.cli import main
from nlptrain.errors import CheckpointError
from nlptrain.integrity import file_checksums, pick_checkpoint, verify_checkpoint

SCAFFOLD = str(REPO / "tests" / "scaffold_callbacks.py")


def fake_checkpoint(folder: Path) -> Path:
    (folder / "shards").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    (folder / "state.pt").write_bytes(b"s" * 300)
    (folder / "shards" / "0.distcp").write_bytes(b"d" * 10)  # any file of any checkpoint format
    (folder / "meta.json").write_text(json.dumps({"global_step": 4, "files": file_checksums(folder)}))
    return folder


def test_each_kind_of_damage_is_named_in_one_line(tmp_path):
    ok = fake_checkpoint(tmp_path / "step-00000004")
    assert set(json.loads((ok / "meta.json").read_text())["files"]) == {
        "model.safetensors", "state.pt", "shards/0.distcp"}
    assert verify_checkpoint(ok) is None

    cut = fake_checkpoint(tmp_path / "cut")
    (cut / "model.safetensors").write_bytes(b"w" * 123)
    assert verify_checkpoint(cut) == f"{cut}/model.safetensors: damaged (size 123 of 1000 bytes)"

    flipped = fake_checkpoint(tmp_path / "flipped")
    (flipped / "state.pt").write_bytes(b"s" * 299 + b"x")
    assert verify_checkpoint(flipped) == f"{flipped}/state.pt: damaged (checksum mismatch)"

    lost = fake_checkpoint(tmp_path / "lost")
    (lost / "shards" / "0.distcp").unlink()
    assert verify_checkpoint(lost) == f"{lost}/shards/0.distcp: missing"

    bad_meta = fake_checkpoint(tmp_path / "bad-meta")
    text = (bad_meta / "meta.json").read_text()
    (bad_meta / "meta.json").write_text(text[: len(text) // 2])
    assert verify_checkpoint(bad_meta).startswith(f"{bad_meta}/meta.json: damaged (not valid JSON")

    assert pick_checkpoint([ok, cut, flipped]) == (ok, [verify_checkpoint(flipped),
                                                        verify_checkpoint(cut)])
    assert pick_checkpoint([cut]) == (None, [verify_checkpoint(cut)])


def truncate(path: Path) -> int:
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    return size


def test_resume_skips_a_damaged_latest_checkpoint_and_fails_cleanly_when_none_is_left(
        toy_task, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
            "--steps-per-epoch", "10", "--checkpoint-every", "5"]
    assert main(args) == 0
    older, latest = list_checkpoints(run / "checkpoints")
    assert (older.name, latest.name) == ("step-00000005", "step-00000010")
    size = truncate(latest / "model.safetensors")
    capsys.readouterr()

    from nlptrain import integrity

    hashed: list[Path] = []
    hash_file = integrity._sha256
    monkeypatch.setattr(integrity, "_sha256", lambda path: hashed.append(path) or hash_file(path))
    assert main([*args, "--resume"]) == 0  # trains steps 6-10 again from step-5
    # Checked before the run's record changes and as it loads, each file read once.
    assert hashed and len(hashed) == len(set(hashed)), hashed
    err = capsys.readouterr().err
    assert (f"{latest}/model.safetensors: damaged (size {size // 2} of {size} bytes): "
            "checkpoint skipped") in err
    assert f"resuming from {older}, the newest whole checkpoint" in err
    assert "resumed from" in err and "step-00000005" in err
    assert verify_checkpoint(latest) is None  # rewritten whole at step 10

    # Both damaged now (a state file and a meta.json): one line, exit code 1, nothing loaded.
    state = (latest / "state.pt").read_bytes()
    (latest / "state.pt").write_bytes(state[:-1] + bytes([state[-1] ^ 1]))
    truncate(older / "meta.json")
    capsys.readouterr()
    recorded = (run / "config.json").read_bytes()
    assert main([*args, "--resume", "--epochs", "2"]) == 1
    assert (run / "config.json").read_bytes() == recorded  # no resume recorded: none took place
    err = capsys.readouterr().err
    assert f"{latest}/state.pt: damaged (checksum mismatch): checkpoint skipped" in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {run / 'checkpoints'}: no whole checkpoint left to resume from (2 "
                      f"damaged; the newest: {latest}/state.pt: damaged (checksum mismatch)); "
                      "start again with --overwrite"]
    assert "Traceback" not in err


def test_two_ranks_restarted_by_torchrun_all_resume_from_the_newest_whole_checkpoint(toy_task,
                                                                                   tmp_path):
    """Rank 0 cuts step-4's weights short and dies at step 5; after the restart both ranks train
    from step-2 (each rank's rows of step 3 are trained twice: before and after the restart)."""
    run, rows_file = tmp_path / "run", tmp_path / "rows.txt"
    out = run_cli(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                   "--steps-per-epoch", "6", "--checkpoint-every", "2",
                   "--callback", f"{SCAFFOLD}:RecordRows",
                   "--callback", f"{SCAFFOLD}:DamageLatestCheckpointThenDie"], tmp_path,
                  torchrun_args=["--standalone", "--nproc_per_node=2", "--max-restarts=1"],
                  AT_STEP="5", ROWS_FILE=str(rows_file))
    assert out.returncode == 0, out.stderr[-3000:]
    step4 = run / "checkpoints" / "step-00000004"
    assert out.stderr.count(f"{step4}/model.safetensors: damaged (size") == 1  # rank 0 says it
    assert "resumed from" in out.stderr and "step-00000002" in out.stderr
    rows = [line.split() for line in rows_file.read_text().splitlines()]
    for rank in ("0", "1"):
        trained = [int(step) for r, _, step, _ in rows if r == rank]
        assert trained.count(3) == 2 * 8 and trained.count(2) == 8, rank  # batch size 8
    assert (run / "model" / "model.safetensors").is_file()


def test_a_copy_of_a_checkpoint_under_another_name_is_left_alone(tmp_path):
    for name in ("step-00000004", "step-00000012", "step-00000012-backup", "step-"):
        fake_checkpoint(tmp_path / name)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000004", "step-00000012"]


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_keeps_the_previous_one(
        tmp_path, tiny_model_dir):
    """The kernel refuses the writes (a file-size limit here, as a full disk would): one line
    naming the checkpoint, the staging folder removed (a full disk gets its space back), the
    checkpoint before it whole."""
    trainer = make_trainer(tmp_path, tiny_model_dir, [])
    folder = tmp_path / "checkpoints"
    save_checkpoint(trainer, folder / "step-00000001", keep=2)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    quiet = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, limit[1]))
    try:
        with pytest.raises(CheckpointError, match=r"step-00000002: cannot be written \(.+\); \d+ MB "
                           "free on its disk; what was saved before it is kept"):
            save_checkpoint(trainer, folder / "step-00000002", keep=2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, quiet)
    assert [p.name for p in folder.iterdir()] == ["step-00000001"]
    assert verify_checkpoint(folder / "step-00000001") is None


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    """Resumed from step 8 (step 12 skipped as damaged), with keep_checkpoints lowered: the
    checkpoint of step 9 is the newest whole one, and stays."""
    for name in ("step-00000004", "step-00000008", "step-00000012", "step-00000009"):
        fake_checkpoint(tmp_path / name)
    prune_checkpoints(tmp_path / "step-00000009", keep=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000008", "step-00000009",
                                                          "step-00000012"]
    prune_checkpoints(tmp_path / "step-00000009", keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000009"]


def test_a_kill_inside_pruning_leaves_what_the_next_start_clears(tmp_path, monkeypatch):
    """Killed inside rmtree once the pruned checkpoint's meta.json was gone: the rest (its
    state.pt, 2/3 of it) was no checkpoint and no leftover, and stayed for ever (review 121)."""
    import shutil

    from nlptrain import checkpoint
    from nlptrain.durable import clear_leftovers

    for name in ("step-00000004", "step-00000008"):
        fake_checkpoint(tmp_path / name)
    (tmp_path / "step-00000004" / "state.pt").write_bytes(b"x" * 100)
    rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):
        if (path / "meta.json").exists():
            (path / "meta.json").unlink()
            raise KeyboardInterrupt  # (a kill: the process ends here)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(tmp_path / "step-00000008", keep=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    assert clear_leftovers(tmp_path) == [".tmp-step-00000004"]
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000008"]


def test_a_worker_death_raised_into_a_checkpoint_write_is_not_said_as_a_write_failure(tmp_path):
    """torch raises a DataLoader worker's death from its SIGCHLD handler wherever the main process
    is: in a checkpoint write it was said as the disk's failure ("cannot be written (DataLoader
    worker ...); 58733 MB free on its disk"). It goes on as itself; the staging folder goes."""
    from nlptrain.checkpoint import writing

    died = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    with pytest.raises(RuntimeError) as raised, writing(tmp_path / "step-00000002") as staging:
        (staging / "model.safetensors").write_bytes(b"half")
        raise died
    assert raised.value is died and list(tmp_path.iterdir()) == []


def test_a_damaged_best_model_is_removed_on_resume_not_loaded_at_the_end(toy_task, tmp_path,
                                                                          monkeypatch, capsys):
    """best/ cut short after the run stopped: the resume trained to the end, then failed loading
    it (safetensors' 'invalid header length'), and so did every resume after."""
    from toy_trainer import best_run_args, results

    monkeypatch.setenv("BEST_STEP", "5")
    monkeypatch.setenv("AT_STEP", "7")
    run = tmp_path / "run"
    args = best_run_args(toy_task, run, "--checkpoint-every", "5", "--eval-every", "5")
    with pytest.raises(RuntimeError, match="injected crash at step 7"):
        main([*args, "--callback", f"{SCAFFOLD}:RaiseAtStep"])
    weights = run / "best" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"the best model of step 5, which the checkpoint names, is damaged "
                     f"({weights}: damaged (size 1000 of ") == 1, err
    assert "removed; the best is chosen again from this run's evaluations" in err
    assert results(run)["valid"]["step"] > 5  # the best of the resumed run's evaluations
    assert json.loads((run / "best" / "nlptrain_best.json").read_text())["step"] > 5
