"""The training step does not stall the device queue. Each optimizer step launches one small
collective and reads back only the flags of the step before (ready by then), never its own, on 2
real ranks; counted by spies on torch.distributed's functions and on the Tensor methods that read
a value back to the host. A non-finite step is skipped on the device, and the read one step later
stops every rank before any later step changes the weights."""

from __future__ import annotations

import sys

import pytest
from ddp import run_ranks

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list",
               "barrier", "reduce_scatter_tensor", "all_gather_into_tensor")
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


def _ours(frame) -> bool:
    """Called from nlptrain's code (not from torch's own, e.g. AdamW's CPU step counters)."""
    name = frame.f_code.co_filename
    return "/nlptrain/" in name or "/callbacks/" in name


def _toy_train(model_dir):
    import tempfile
    from pathlib import Path

    from conftest import write_toy_tsv
    from transformers import AutoTokenizer

    from nlptrain.config import FileSpec
    from nlptrain.data import LabelVocab, TokenizedDataset, read_examples

    folder = Path(tempfile.mkdtemp())
    examples = read_examples(FileSpec(path=str(write_toy_tsv(folder / "t.tsv", 96, seed=1))), "", [])
    return TokenizedDataset.from_texts(examples.texts, LabelVocab.from_config(["neg", "pos"])
                                       .encode(examples), AutoTokenizer.from_pretrained(model_dir), 32)


def _count(rank, world_size, model_dir):
    import torch
    import torch.distributed as dist
    from nlptrain.callbacks import FGM
    from transformers import AutoModelForSequenceClassification

    from nlptrain import Callback, DistTrainer, TrainConfig, grad_norm

    counts = {"collectives": 0, "host_reads": 0, "own_step_reads": 0}
    reduced: list = []      # the tensors the loop's collectives were given, in order
    step_began = [0]        # where in `reduced` the step under way began

    def spy(owner, name, key):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            if _ours(sys._getframe(1)):
                counts[key] += 1
                if key == "collectives" and args and isinstance(args[0], torch.Tensor):
                    reduced.append(args[0])
                if key == "host_reads" and any(args[0] is t for t in reduced[step_began[0]:]):
                    counts["own_step_reads"] += 1  # a value this very step reduced: a stall
            return real(*args, **kwargs)
        setattr(owner, name, counted)

    train = _toy_train(model_dir)
    seen = []

    class AtEachStep(Callback):
        def on_step_end(self, trainer) -> None:
            seen.append((trainer.epoch, trainer.batch_in_epoch, dict(counts)))
            step_began[0] = len(reduced)

    # The clip reads its factor where reading is free (a CPU: no queue), to skip multiplying by
    # 1; counted here as on a GPU, which it never reads on (tests/test_grad_norm.py).
    grad_norm.reading_is_free = lambda device: False
    for name in COLLECTIVES:
        spy(dist, name, "collectives")
    for name in HOST_READS:
        spy(torch.Tensor, name, "host_reads")
    unfused = lambda groups, config: torch.optim.AdamW(groups, lr=config.lr, foreach=False)  # noqa: E731
    found = {}
    for name, grad_accum, optimizer, more in (("fused", 1, None, []), ("fused", 3, None, []),
                                              ("fgm", 2, None, [FGM(1.0)]),
                                              ("unfused", 1, unfused, []),
                                              ("touched", 1, None, [])):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
        seen.clear()
        # The gradient sync as on a GPU (DDP's own all-reduce, which no spy sees, not the CPU's
        # shared-memory sum), but for "touched": the CPU's row-sparse sync of the word
        # embedding over gloo (nlptrain.cpu_gradient_sync).
        trainer = DistTrainer(model, train, callbacks=[AtEachStep(), *more], optimizer=optimizer,
                              config=TrainConfig(epochs=2, batch_size=4, log_every=1000,
                                                 grad_accum=grad_accum,
                                                 sync_touched_rows=name == "touched",
                                                 shared_memory_all_reduce=False))
        trainer.fit()
        trainer.close()
        found[name, grad_accum] = per_step = []
        for (epoch_a, _, a), (epoch_b, batches_b, b) in zip(seen, seen[1:], strict=False):
            if epoch_a == epoch_b:  # steps inside an epoch (an epoch's start agrees on more)
                per_step.append({k: b[k] - a[k] for k in counts} | {"batches": batches_b})
    return found


def _both(rank, world_size, model_dir):  # one launch of 2 ranks for both tests
    return {"nan": _nan_on_one_rank(rank, world_size, model_dir),
            "counts": _count(rank, world_size, model_dir)}  # last: it leaves its spies in place


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, tiny_model_dir):
    return run_ranks(_both, 2, tmp_path_factory.mktemp("syncs"), str(tiny_model_dir))


@pytest.mark.distributed
def test_one_collective_per_step_and_no_read_of_the_steps_own_flags(ranks):
    for found in (rank["counts"] for rank in ranks):
        for (name, grad_accum), per_step in found.items():
            # 96 rows: 12 micro-batches of 4 rows per rank and epoch; 2 epochs.
            assert [s["batches"] for s in per_step] == list(range(2 * grad_accum, 13, grad_accum)) * 2
            counted = {(s["collectives"], s["host_reads"], s["own_step_reads"]) for s in per_step}
            # Fused AdamW skips a step on the device: the step reads the previous step's flags
            # (FGM's extra pass adds no read and no collective). An optimizer that cannot skip
            # on the device must read its own flags before stepping: the contrast.
            # On a CPU the embedding's sync adds its two all-reduces (the touched rows' mask, then
            # those rows with the bucket's other gradients) and reads nothing of the step's flags.
            expected = {"unfused": {(1, 1, 1)}, "touched": {(3, 1, 0)}}.get(name, {(1, 1, 0)})
            assert counted == expected, (name, per_step)


def _nan_on_one_rank(rank, world_size, model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification

    from nlptrain import Callback, DistTrainer, TrainConfig
    from nlptrain.errors import TrainingError

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    after: dict = {}

    class Snapshot(Callback):
        def on_step_end(self, trainer) -> None:
            after[trainer.global_step] = {k: v.detach().clone()
                                          for k, v in trainer.unwrapped_model.state_dict().items()}

    trainer = DistTrainer(model, _toy_train(model_dir), callbacks=[Snapshot()],
                          config=TrainConfig(epochs=1, batch_size=4))
    plain = trainer.loss_fn
    trainer.loss_fn = lambda logits, labels: (  # rank 1's loss is NaN in step 3 only
        plain(logits, labels) * (torch.nan if rank == 1 and trainer.global_step == 2 else 1.0))
    try:
        trainer.fit()
        error = None
    except TrainingError as raised:
        error = str(raised)
    final = {k: v.detach() for k, v in trainer.unwrapped_model.state_dict().items()}
    steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    trainer.close()
    return {"error": error, "global_step": trainer.global_step, "adam_steps": steps,
            "unchanged_since_step_2": all(torch.equal(final[k], after[2][k]) for k in final),
            "step_3_skipped": all(torch.equal(after[3][k], after[2][k]) for k in final)}


@pytest.mark.distributed
def test_a_nan_on_one_rank_is_skipped_on_the_device_and_stops_both_before_the_next_step(ranks):
    for found in (rank["nan"] for rank in ranks):
        assert "not finite at epoch 1, batch 3 (optimizer step 3) on 1 rank(s)" in found["error"]
        # Step 3 was counted before its flags were read, but AdamW left weights and moments be.
        assert found["global_step"] == 3 and found["adam_steps"] == {2}
        assert found["step_3_skipped"] and found["unchanged_since_step_2"]


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_a_non_finite_step_counts_the_ranks_it_came_from_not_their_micro_batches(
        tmp_path, tiny_model_dir, grad_accum):
    import torch
    from toy_trainer import make_trainer

    from nlptrain.errors import TrainingError

    trainer = make_trainer(tmp_path, tiny_model_dir, [], epochs=1, batch_size=4,
                           grad_accum=grad_accum)
    plain = trainer.loss_fn
    trainer.loss_fn = lambda logits, labels: (  # every micro-batch of step 3: NaN
        plain(logits, labels) * (torch.nan if trainer.global_step == 2 else 1.0))
    batches = "3" if grad_accum == 1 else "5-6"
    with pytest.raises(TrainingError, match=rf"at epoch 1, batch {batches} \(optimizer step 3\) "
                                            r"on 1 rank\(s\);"):
        trainer.fit()
