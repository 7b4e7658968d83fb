"""FSDP2 against DDP on real ranks (gloo on loopback): same training, exact evaluation with
unequal shares, sharded checkpoints that resume exactly and with another world size, and whole
weights in model/ and best/ that transformers.pipeline loads and scores as nlptrain did."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from conftest import run_cli
from ddp import run_ranks
from strategy_workers import (
    checkpoint_worker,
    equivalence_worker,
    eval_set,
    freeze_worker,
    make_trainer,
    scale_worker,
    toy_set,
    unsharded_after_eval_worker,
)

from nlptrain.checkpoint import list_checkpoints, load_checkpoint
from nlptrain.errors import CheckpointError
from nlptrain.evaluate import compute_metrics, predict
from nlptrain.models import load_model

pytestmark = pytest.mark.distributed


def max_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def one_process_eval(tmp_path_factory, tiny_model_dir) -> dict:
    """The untrained tiny model's metrics on `eval_set` (rt-polarity's 1,067 test rows, divisible
    by neither 2 nor 3), in this one process."""
    big = eval_set(tmp_path_factory.mktemp("one"), str(tiny_model_dir))
    from nlptrain import distributed
    from nlptrain.data import Collator

    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    return compute_metrics(predict(model, big, distributed.SingleProcess(), Collator(0), 13),
                           ["neg", "pos"])


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2_trains_like_ddp_and_evaluates_like_one_process(tmp_path, tiny_model_dir, world,
                                                               one_process_eval):
    accumulate = 2 if world == 3 else 1  # 3 ranks accumulate: set_requires_gradient_sync
    eval_batch = {2: 13, 3: 71}[world]   # 533 = 13 x 41, 355 = 71 x 5: the shares' batch counts differ
    ranks = run_ranks(equivalence_worker, world, tmp_path, str(tmp_path), str(tiny_model_dir),
                      accumulate, eval_batch)
    ddp, fsdp = ranks[0]["ddp"], ranks[0]["fsdp"]
    assert (ddp["kind"], fsdp["kind"]) == ("DDP", "FSDP2")
    assert ddp["steps"] == fsdp["steps"] == 10
    assert max(fsdp["norms"]) > 0.05  # clipping did clip, by the global norm...
    for other in ranks[1:]:  # ...which every rank saw the same (whole weights are on rank 0)
        assert other["fsdp"]["norms"] == fsdp["norms"]
    assert max(abs(a - b) for a, b in zip(ddp["norms"], fsdp["norms"], strict=True)) < 1e-5
    gap = max_gap(ddp["params"], fsdp["params"])
    print(f"world {world}: FSDP2 vs DDP max parameter gap after 10 steps {gap:.2e}")
    assert gap < 1e-5
    for key in ("rows", "correct", "accuracy", "confusion_matrix"):
        assert fsdp["metrics"][key] == ddp["metrics"][key], key
    # Evaluation: unequal batch counts, no hang, the one-process metrics exactly.
    assert len({r["eval_batches"] for r in ranks}) == 2
    for rank in ranks:
        for key in ("rows", "correct", "accuracy", "macro_f1", "confusion_matrix", "per_class"):
            assert rank["eval"][key] == one_process_eval[key], key
        assert abs(rank["eval"]["loss"] - one_process_eval["loss"]) < 1e-6


def test_sharded_checkpoints_resume_exactly_and_with_other_world_sizes(tmp_path, tiny_model_dir):
    rows, model_dir = 48, str(tiny_model_dir)  # 2 ranks: 6 steps an epoch, 12 in all
    two = run_ranks(checkpoint_worker, 2, tmp_path, str(tmp_path), model_dir, "fsdp", rows)[0]
    assert two["kind"] == ["FSDP2", "FSDP2"] and two["steps"] == [12, 12]
    saved = list_checkpoints(tmp_path / "fsdp-2")
    assert [p.name[-2:] for p in saved] == ["03", "06", "09", "12"]
    step6 = saved[1]
    assert sorted(p.name for p in (step6 / "shards").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard
    assert not (step6 / "model.safetensors").exists()
    assert not [p for p in (tmp_path / "fsdp-2").iterdir() if p.name.startswith(".tmp-")]
    # The same world resumed exactly: every weight equal to the uninterrupted run's.
    assert two["loaded_step"] == 6
    assert max_gap(two["loaded"], two["at"][6]) == 0
    assert max_gap(two["resumed_final"], two["final"]) == 0

    # 3 ranks read the 2-rank shards (DCP reshards) and train on from step 6.
    three = run_ranks(checkpoint_worker, 3, tmp_path / "three", str(tmp_path / "three"),
                      model_dir, "fsdp", rows, str(step6))[0]
    assert three["kind"] == ["FSDP2"] and three["loaded_step"] == 6
    assert max_gap(three["loaded"], two["at"][6]) == 0
    assert three["steps"] == [6 + 4]  # epoch 2, 48 rows on 3 ranks of 4 rows: 4 steps

    # One process reads them too (a plain model, the optimizer state put together whole).
    train = toy_set(tmp_path / "single", model_dir, "train", rows, seed=1)
    from nlptrain import distributed

    trainer = make_trainer(distributed.SingleProcess(), model_dir, train, None, "fsdp", [],
                           epochs=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_checkpoint(trainer, step6)
    assert [str(w.message) for w in caught] == []  # nothing a user should act on
    assert type(trainer.strategy).__name__ == "SingleDevice"
    assert max_gap(trainer.strategy.full_state_dict(trainer.model), two["at"][6]) == 0
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    assert len(trainer.optimizer.state) == len(trained)  # every parameter's moments came back
    assert all(int(s["step"]) == 6 for s in trainer.optimizer.state.values())
    # The schedule's base lr came back too: the run's lr, not step 6's point on the schedule
    # (which a resume took for the base, and logged as a change of lr).
    assert [g["initial_lr"] for g in trainer.optimizer.param_groups] == [1e-3, 1e-3]


def test_ema_and_frozen_blocks_under_fsdp2_checkpoint_whole_and_resume_exactly(tmp_path,
                                                                               tiny_model_dir):
    """Each rank averages its own shard; the checkpoint holds the whole average, and a resume
    from step 6 ends on the same averaged weights (exported at the end) as the run never stopped.
    The embeddings are frozen (no optimizer state in the shards) and still resume."""
    two = run_ranks(checkpoint_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir), "fsdp", 48,
                    "", 6, 0.9, True)[0]
    assert two["kind"] == ["FSDP2", "FSDP2"] and two["steps"] == [12, 12]
    saved = torch.load(tmp_path / "fsdp-2" / "step-00000006" / "state.pt", weights_only=True)
    average = saved["callbacks"]["ema"]["average"]
    assert {name: tuple(t.shape) for name, t in average.items()} == {
        name: tuple(t.shape) for name, t in two["loaded"].items() if name in average}
    assert max_gap(two["resumed_final"], two["final"]) == 0


def test_freezing_under_fsdp2_trains_like_ddp_and_fgm_is_refused(tmp_path, tiny_model_dir):
    first = run_ranks(freeze_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))[0]
    # A hook on a sharded parameter never fires: FGM would silently double the clean gradient.
    assert "FGM moves rows of the whole word-embedding matrix" in first.pop("fgm")
    ddp, fsdp = first["ddp"], first["fsdp"]
    assert (ddp.pop("kind"), fsdp.pop("kind")) == ("DDP", "FSDP2")
    start = fsdp[0]
    blocks = [[k for k in start if ".embeddings." in k], [k for k in start if ".layer.0." in k],
              [k for k in start if ".layer.1." in k]]
    # 3 blocks: all frozen for steps 1-2, then layer 1 trains from step 3, layer 0 from step 5;
    # the embeddings stay frozen (the head always trains).
    for block, unfrozen_at in zip(blocks, (None, 5, 3), strict=True):
        for step in range(1, 7):
            same = all(torch.equal(start[k], fsdp[step][k]) for k in block)
            assert same == (unfrozen_at is None or step < unfrozen_at), (block[0], step)
    assert not torch.equal(start["classifier.weight"], fsdp[2]["classifier.weight"])
    for step in range(7):
        assert max_gap(ddp[step], fsdp[step]) < 1e-5, step


def test_weights_kept_gathered_after_forward_are_sharded_again_after_an_evaluation(tmp_path,
                                                                                   tiny_model_dir):
    """An evaluation has no backward, which is what reshards them: every callback after it saw
    plain tensors in place of the parameters (EMA's swap failed; Freeze unfroze nothing)."""
    ranks = run_ranks(unsharded_after_eval_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    assert [r["sharded"] for r in ranks] == [True, True]
    assert ranks[0]["steps"] == 6 and ranks[0]["final"]


def test_fsdp_run_exports_whole_weights_that_pipeline_scores_as_nlptrain(toy_task, tmp_path):
    from transformers import pipeline

    run = tmp_path / "run"
    out = run_cli(["train", "--task", str(toy_task), "--output-dir", str(run), "--strategy", "fsdp",
                   "--set", "data.valid_size=0.2", "--epochs", "1"], tmp_path, nproc=2)
    assert out.returncode == 0, out.stderr[-3000:]
    ours = json.loads((run / "results.json").read_text())
    rows = [line.split("\t") for line in (toy_task.parent / "test.tsv").read_text().splitlines()[1:]]
    for folder in ("model", "best"):
        config = json.loads((run / folder / "config.json").read_text())
        assert config["architectures"] == ["BertForSequenceClassification"]
        classify = pipeline("text-classification", model=str(run / folder), device="cpu")
        found = classify([text for text, _ in rows], truncation=True, max_length=32, batch_size=16)
        correct = sum(f["label"] == label for f, (_, label) in zip(found, rows, strict=True))
        assert correct == ours["test"]["correct"], folder  # best is model: one evaluation


def test_eight_ranks_on_loopback_then_four_resume(tmp_path, tiny_model_dir):
    """8 ranks (1 thread each): exact evaluation, agreed step counts, and a checkpoint written by 8
    that 4 ranks resume, under DDP and FSDP2."""
    eight = run_ranks(scale_worker, 8, tmp_path, str(tmp_path), str(tiny_model_dir), "", True,
                      timeout=600)
    for strategy, kind in (("ddp", "DDP"), ("fsdp", "FSDP2")):
        assert {r[strategy]["kind"] for r in eight} == {kind}
        assert {(r[strategy]["steps"], r[strategy]["batches"]) for r in eight} == {(3, 3)}
        shards = tmp_path / f"{strategy}-8" / "step-00000002"
        assert (shards / "shards").is_dir() == (strategy == "fsdp")
    four = run_ranks(scale_worker, 4, tmp_path / "four", str(tmp_path / "four"),
                     str(tiny_model_dir), str(tmp_path), False, timeout=600)
    for strategy in ("ddp", "fsdp"):
        assert max_gap(four[0][strategy]["loaded"], eight[0][strategy]["at"][2]) == 0
        # 48 rows, 32 read by 8 ranks at step 2: 16 remain, 2 steps of 4 ranks x 2 rows.
        assert {r[strategy]["steps"] for r in four} == {2 + 2}
    # The trained 8-rank model, scored by one process, scores as the 8 ranks did together.
    from nlptrain import distributed
    from nlptrain.data import Collator

    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    model.load_state_dict(eight[0]["fsdp"]["final"])
    big = eval_set(tmp_path / "one", str(tiny_model_dir))
    alone = compute_metrics(predict(model, big, distributed.SingleProcess(), Collator(0), 13),
                            ["neg", "pos"])
    for rank in eight:
        for key in ("rows", "correct", "accuracy", "macro_f1", "confusion_matrix", "per_class"):
            assert rank["fsdp"]["eval"][key] == alone[key], key


def test_a_resume_fsdp_cannot_load_is_refused_and_leaves_the_run_as_it_was(toy_task, tmp_path):
    """A one-process run checkpoints whole weights; fsdp on 2 processes loads only shards. The
    refusal must name the cure (said once, by `--nproc`'s own process, before any worker
    starts), and must not record fsdp in config.json, which each rank checks again (a launcher
    of its own, e.g. torchrun): else the plain `--resume` that follows would be refused as well."""
    from nlptrain.run_record import read_config
    from nlptrain.runs import prepare_run_dir

    run = tmp_path / "run"
    first = run_cli(["train", "--task", str(toy_task), "--output-dir", str(run), "--max-steps", "2"],
                    tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = (run / "config.json").read_text()
    refusal = ("step-00000002: holds whole weights (written by one process, or under ddp), which "
               "fsdp on 2 processes cannot load; resume it with [train] strategy = ddp, or in one "
               "process")
    refused = run_cli(["train", "--output-dir", str(run), "--resume", "--strategy", "fsdp",
                       "--max-steps", "3", "--nproc", "2"], tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.count(refusal) == 1, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr and "rank" not in refused.stderr, refused.stderr
    task = read_config(run)["task"]
    with pytest.raises(CheckpointError, match=re.escape(refusal)):  # a rank's own check
        prepare_run_dir(run, {**task, "train": {**task["train"], "strategy": "fsdp"}}, 2,
                        resume=True, overwrite=False)
    assert (run / "config.json").read_text() == recorded
    again = run_cli(["train", "--output-dir", str(run), "--resume", "--max-steps", "3"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]


def test_the_fsdp_resume_check_looks_at_the_checkpoint_a_resume_takes(tmp_path):
    """A set-aside branch (step-N-set-aside-TIME) sorts after the checkpoints by name, and a
    damaged newest one is skipped by the resume: neither is what the check must look at."""
    from nlptrain.integrity import META, SHARDS
    from nlptrain.resume_checks import check_strategy_fits

    checkpoints = tmp_path / "checkpoints"
    sharded = checkpoints / "step-00000010"
    (sharded / SHARDS).mkdir(parents=True)
    (sharded / META).write_text("{}")
    aside = checkpoints / "step-00000020-set-aside-20260101-120000"
    aside.mkdir()
    (aside / "model.safetensors").write_bytes(b"whole")
    (aside / META).write_text("{}")
    damaged = checkpoints / "step-00000030"  # whole weights, but no meta.json: never resumed
    damaged.mkdir()
    (damaged / "model.safetensors").write_bytes(b"whole")
    check_strategy_fits(tmp_path, {"strategy": "fsdp"}, world_size=2)  # the step-10 shards: fits
    (sharded / SHARDS).rmdir()
    with pytest.raises(CheckpointError, match=r"step-00000010: holds whole weights"):
        check_strategy_fits(tmp_path, {"strategy": "fsdp"}, world_size=2)
