"""The training step does not stall the device queue: one small collective and one host read
per optimizer step (none per micro-batch), counted by spies on torch.distributed's functions
and on the Tensor methods that read a value back to the host, on 2 real ranks."""

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


def _count(rank, world_size, model_dir):
    import torch
    import torch.distributed as dist
    from conftest import write_toy_tsv
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from nlptrain import Callback, DistTrainer, TrainConfig
    from nlptrain.config import FileSpec
    from nlptrain.data import LabelVocab, TokenizedDataset, read_examples

    counts = {"collectives": 0, "host_reads": 0}

    def spy(owner, name, key):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            if _ours(sys._getframe(1)):
                counts[key] += 1
            return real(*args, **kwargs)
        setattr(owner, name, counted)

    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    examples = read_examples(FileSpec(path=str(write_toy_tsv(folder / "t.tsv", 96, seed=1))), "", [])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = TokenizedDataset.from_texts(examples.texts, LabelVocab.from_config(["neg", "pos"])
                                        .encode(examples), tokenizer, 32)
    seen = []

    class AtEachStep(Callback):
        def on_step_end(self, trainer) -> None:
            seen.append((trainer.epoch, trainer.batch_in_epoch, dict(counts)))

    for name in COLLECTIVES:
        spy(dist, name, "collectives")
    for name in HOST_READS:
        spy(torch.Tensor, name, "host_reads")
    found = {}
    for grad_accum in (1, 3):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
        seen.clear()
        trainer = DistTrainer(model, train, callbacks=[AtEachStep()], config=TrainConfig(
            epochs=2, batch_size=4, log_every=1000, grad_accum=grad_accum))
        trainer.fit()
        trainer.close()
        found[grad_accum] = per_step = []
        for (epoch_a, _, a), (epoch_b, batches_b, b) in zip(seen, seen[1:], strict=False):
            if epoch_a == epoch_b:  # steps inside an epoch (an epoch's start agrees on more)
                per_step.append({k: b[k] - a[k] for k in counts} | {"batches": batches_b})
    return found


@pytest.mark.distributed
def test_one_collective_and_one_host_read_per_optimizer_step(tmp_path, tiny_model_dir):
    for found in run_ranks(_count, 2, tmp_path, str(tiny_model_dir)):
        for grad_accum, per_step in found.items():
            # 96 rows: 12 micro-batches of 4 rows per rank and epoch; 2 epochs.
            assert [s["batches"] for s in per_step] == list(range(2 * grad_accum, 13, grad_accum)) * 2
            assert {(s["collectives"], s["host_reads"]) for s in per_step} == {(1, 1)}, per_step
