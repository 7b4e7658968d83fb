"""Ranks on one host sum gradients through shared memory (`nlptrain.shared_memory`): gloo's
sums, on 2 and 3 real ranks; a fallback to gloo where a rank cannot map the file; and DDP
training that ends with the weights of gloo's all-reduce, to the bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp import run_ranks
from toy_trainer import toy_datasets

from nlptrain import DistTrainer, TrainConfig
from nlptrain.models import load_model
from nlptrain.shared_memory import BYTES_PER_RANK, LEAST_BYTES, slot_bytes

SIZES = (1, 2, 7, 1000, 5003)  # the last spans several 4 KiB slots


def sums_worker(rank: int, world: int, folder: str) -> dict:
    import torch.distributed as dist

    from nlptrain.shared_memory import SharedMemoryAllReduce

    dist.init_process_group("gloo")
    shared = SharedMemoryAllReduce.attach(bytes_per_rank=4096, directory=Path(folder))
    dist.barrier()  # rank 0 has removed the file's name
    out: dict = {"attached": shared is not None, "files_left": sorted(p.name for p in
                                                                       Path(folder).iterdir())}
    for dtype in (torch.float32, torch.bfloat16):
        for n in SIZES:
            values = torch.randn(n, generator=torch.Generator().manual_seed(100 * rank + n)).to(dtype)
            expected = values.clone()
            dist.all_reduce(expected)
            mean, expected_mean = values.clone(), values / world  # DDP's order: divide, then sum
            dist.all_reduce(expected_mean)
            shared(values)
            shared(mean, mean=True)
            out[dtype, n] = (values.float().tolist(), expected.float().tolist())  # lists: no fds
            out["mean", dtype, n] = (mean.float().tolist(), expected_mean.float().tolist())
    # Added in rank order wherever an element lies ((1e8 + 1) - 1e8 = 0 in float32, while
    # rank 2's own-first order gave (-1e8 + 1e8) + 1 = 1): DDP's bucket layout, which a resume's
    # first step has another of, moves elements between the ranks that sum them.
    values = torch.full((5003,), (1e8, 1.0, -1e8)[rank])
    shared(values)
    out["rank_order"] = sorted(set(values.tolist()))
    # A rank that cannot see rank 0's file (here: another directory, as on another host) makes
    # every rank fall back.
    apart = Path(folder) / f"apart{rank}"
    apart.mkdir()
    out["apart"] = bool(SharedMemoryAllReduce.attach(directory=apart if rank else Path(folder)))
    # No room for the slots: no file, and gloo on every rank.
    out["no_room"] = bool(SharedMemoryAllReduce.attach(bytes_per_rank=1 << 60, directory=Path(folder)))
    dist.barrier()
    out["files_at_end"] = sorted(p.name for p in Path(folder).iterdir() if p.is_file())
    dist.destroy_process_group()
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_the_shared_memory_sum_is_glooss_on_every_rank(tmp_path, world):
    ranks = run_ranks(sums_worker, world, tmp_path, str(tmp_path))
    for rank in ranks:
        assert rank["attached"]
        assert rank["files_left"] == []  # unlinked once every rank had mapped it
        for dtype in (torch.float32, torch.bfloat16):
            for n in SIZES:
                for key in ((dtype, n), ("mean", dtype, n)):
                    got, expected = rank[key]
                    if world == 2:  # a + b either way; (a + b) / 2 = a / 2 + b / 2
                        assert got == expected, key
                    else:  # only the order of the additions (and division) differs from gloo's
                        assert torch.allclose(torch.tensor(got), torch.tensor(expected), atol=0.05)
                    assert got == ranks[0][key][0]  # the same values on every rank
        assert rank["rank_order"] == [0.0 if world == 3 else 1e8]
        assert not rank["apart"] and not rank["no_room"]
        assert rank["files_at_end"] == []


def train_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    own = Path(folder) / f"rank{rank}"
    own.mkdir(exist_ok=True)
    train, _ = toy_datasets(own, Path(model_dir), rows=40)
    out = {}
    for touched in (False, True):
        for shared in (False, True):
            torch.manual_seed(0)
            model = load_model(model_dir, ["neg", "pos"])  # dropout on: masks from the seed
            config = TrainConfig(epochs=1, batch_size=4, lr=1e-3, seed=5, timeout=60, grad_accum=2,
                                 sync_touched_rows=touched, shared_memory_all_reduce=shared)
            trainer = DistTrainer(model, train, None, config=config)
            trainer.fit()
            sync = trainer.strategy.gradient_sync
            out[touched, shared] = {
                "through_shared_memory": sync is not None and sync.shared is not None,
                "by_rows": sync is not None and sync.embedding is not None,
                "params": {k: v.detach().clone() for k, v in
                           trainer.unwrapped_model.state_dict().items()}}
            trainer.close()
    return out


@pytest.mark.distributed
def test_ddp_through_shared_memory_trains_bit_for_bit_like_gloo(tmp_path, tiny_model_dir):
    ranks = run_ranks(train_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    for rank in ranks:
        gloo = rank[False, False]
        assert not gloo["through_shared_memory"]
        assert rank[True, False]["by_rows"]  # the untouched rows are left out over gloo...
        assert rank[True, True]["by_rows"]  # ...and through shared memory
        assert not rank[False, True]["by_rows"]
        for touched in (False, True):
            assert rank[touched, True]["through_shared_memory"]
            for name, value in gloo["params"].items():
                assert torch.equal(rank[touched, True]["params"][name], value), (touched, name)


def test_slots_fit_in_half_of_what_is_free():
    mib = 1 << 20
    assert slot_bytes(24 << 30, 2) == BYTES_PER_RANK  # a roomy /dev/shm: one bucket a slot
    assert slot_bytes(64 * mib, 2) == 16 * mib  # Docker's default 64 MiB: half of it
    assert slot_bytes(64 * mib, 3) % 4096 == 0 and 3 * slot_bytes(64 * mib, 3) <= 32 * mib
    assert slot_bytes(64 * mib, 64) == 0 < LEAST_BYTES  # too little a slot: gloo instead
    assert slot_bytes(24 << 30, 8) == 32 * mib  # many ranks: 256 MiB in all at most


@pytest.mark.distributed
def test_three_ranks_resume_to_the_uninterrupted_runs_weights_to_the_bit(tmp_path, tiny_model_dir):
    """A resumed process's first step all-reduces in DDP's first bucket layout, the uninterrupted
    run's in the rebuilt one: the ranks that summed an element, and in which order, differed, and
    on 3 ranks (a + b) + c is not (b + a) + c (1.5e-8 after the first step, growing)."""
    from strategy_workers import checkpoint_worker

    three = run_ranks(checkpoint_worker, 3, tmp_path, str(tmp_path), str(tiny_model_dir), "ddp", 48)[0]
    assert three["kind"] == ["DDP", "DDP"] and three["steps"] == [8, 8]
    assert all(torch.equal(three["resumed_final"][k], v) for k, v in three["final"].items())


def test_a_killed_runs_file_is_removed_by_the_next_run_and_a_live_ones_kept(tmp_path):
    """A rank SIGKILLed between rank 0 making the file and every rank mapping it left 128 MiB in
    /dev/shm until a reboot (one was found there from an earlier day's killed test)."""
    import os
    import subprocess
    import time

    from nlptrain.shared_memory import PREFIX, STALE_S, remove_stale_files

    gone = subprocess.Popen(["true"])
    gone.wait()
    files = {"dead_old": f"{PREFIX}{gone.pid}-ab", "live_old": f"{PREFIX}{os.getpid()}-cd",
             "dead_new": f"{PREFIX}{gone.pid}-ef", "older_name": f"{PREFIX}10c8f7c8d1314be5a7d7ce52e3d5e5d5",
             "other": "someone-elses-file"}
    for key, name in files.items():
        (tmp_path / name).write_bytes(b"x" * 10)
        if key != "dead_new":
            old = time.time() - STALE_S - 5
            os.utime(tmp_path / name, (old, old))
    remove_stale_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        files[key] for key in ("live_old", "dead_new", "other"))
