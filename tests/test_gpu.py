"""The CUDA paths: nccl under DDP (world size 1), bf16 autocast, pinned batches, activation
checkpointing (less memory, the same training), and an export trained on the GPU that scores
the same on the CPU. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import free_port, run_cli
from toy_trainer import model_without_dropout, toy_datasets

from nlptrain import Callback, DistTrainer, TrainConfig, Trainer
from nlptrain.data import Collator
from nlptrain.distributed import Distributed
from nlptrain.loaders import train_loader
from nlptrain.models import load_model
from nlptrain.precision import PIN_VARIABLE
from nlptrain.strategies import DDP

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


class Seen(Callback):
    """What the loop ran on: the devices of batch and weights, and the logits' dtype."""

    def __init__(self) -> None:
        self.seen: dict[str, object] = {}

    def on_loss(self, trainer: Trainer, loss: torch.Tensor) -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16,
                                             enabled=trainer.config.precision == "bf16"):
            logits = trainer.forward(trainer.batch)
        self.seen.update(batch=trainer.batch["input_ids"].device.type, logits=logits.dtype,
                         weights=next(trainer.unwrapped_model.parameters()).device.type,
                         loss=loss.item())


def test_ddp_on_nccl_at_world_size_one_trains_on_the_gpu(tmp_path, tiny_model_dir, monkeypatch):
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    dist = Distributed(timeout_s=60)
    assert torch.distributed.get_backend() == "nccl"
    train, test = toy_datasets(tmp_path, tiny_model_dir)
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    seen = Seen()
    trainer = DistTrainer(model, train, test, config=TrainConfig(epochs=2, batch_size=8, lr=1e-3,
                                                                 precision="bf16"),
                          callbacks=[seen], dist=dist, strategy=DDP(dist))
    try:
        metrics = trainer.fit()
        assert isinstance(trainer.model, torch.nn.parallel.DistributedDataParallel)
        assert seen.seen["batch"] == seen.seen["weights"] == "cuda"
        assert seen.seen["logits"] == torch.bfloat16  # autocast ran the matmuls in bf16
        assert np.isfinite(seen.seen["loss"]) and metrics["rows"] == len(test)
        assert next(trainer.unwrapped_model.parameters()).dtype == torch.float32  # master weights
    finally:
        trainer.close()
        dist.close()
    assert not torch.distributed.is_initialized()


def test_training_batches_come_pinned_for_non_blocking_copies(tmp_path, tiny_model_dir):
    train, _ = toy_datasets(tmp_path, tiny_model_dir)
    loader = train_loader(train, TrainConfig(batch_size=8), 1, 0, Collator(0), torch.device("cuda"))
    batch = next(iter(loader))
    assert all(tensor.is_pinned() for tensor in batch.values())


def test_a_model_trained_on_the_gpu_in_bf16_exports_and_scores_alike_on_the_cpu(toy_task, tmp_path):
    from transformers import pipeline

    run = tmp_path / "run"
    done = run_cli(["train", "--task", str(toy_task), "--output-dir", str(run), "--precision", "bf16",
                    "--log-level", "info"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cuda" in done.stderr
    assert json.loads((run / "config.json").read_text())["precision"]["chosen"] == "bf16"
    saved = np.load(run / "predictions.npz")
    classify = pipeline("text-classification", model=str(run / "model"), device="cpu")
    texts = [line.split("\t")[0] for line in (Path(toy_task).parent / "test.tsv").read_text()
             .splitlines()[1:]]
    scored = classify(texts, top_k=None, function_to_apply="softmax", truncation=True, max_length=32)
    names = classify.model.config.id2label
    probs = np.array([[{r["label"]: r["score"] for r in row}[names[i]] for i in range(len(names))]
                      for row in scored])
    # The run scored in bf16 on the GPU, the pipeline in fp32 on the CPU: close, same answers.
    np.testing.assert_allclose(probs, saved["outputs"], atol=3e-2)
    assert (probs.argmax(1) == saved["outputs"].argmax(1)).mean() >= 0.95


def test_the_step_reads_its_flags_a_step_late_through_pinned_memory(tmp_path, tiny_model_dir):
    """On CUDA: the agreed flags are copied to pinned memory as they are made; a NaN in step 3
    is skipped by fused AdamW on the GPU, and the next read stops before step 4 is applied."""
    from nlptrain.errors import TrainingError

    train, _ = toy_datasets(tmp_path, tiny_model_dir)
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    after: dict[int, dict[str, torch.Tensor]] = {}
    pinned: list[bool] = []

    class Watch(Callback):
        def on_step_end(self, trainer: Trainer) -> None:
            after[trainer.global_step] = {k: v.detach().clone()
                                          for k, v in trainer.unwrapped_model.state_dict().items()}
            pinned.append(trainer._pending is not None and trainer._pending._host.is_pinned())

    trainer = Trainer(model.cuda(), train, callbacks=[Watch()],
                      config=TrainConfig(epochs=1, batch_size=8, precision="bf16"))
    plain = trainer.loss_fn
    trainer.loss_fn = lambda logits, labels: (
        plain(logits, labels) * (torch.nan if trainer.global_step == 2 else 1.0))
    with pytest.raises(TrainingError, match=r"optimizer step 3\)"):
        trainer.fit()
    assert pinned == [True, True, True]
    final = trainer.unwrapped_model.state_dict()
    assert all(torch.equal(final[k], after[2][k]) for k in final)


def test_compile_on_the_gpu_trains_like_eager(tmp_path, tiny_model_dir):
    train, test = toy_datasets(tmp_path, tiny_model_dir)
    losses = {}
    for compiled in (False, True):
        model = model_without_dropout(tiny_model_dir)
        trainer = Trainer(model, train, test, config=TrainConfig(
            epochs=2, batch_size=8, lr=1e-3, precision="fp32", compile=compiled))
        try:
            losses[compiled] = trainer.fit()["loss"]
        finally:
            trainer.close()
        assert next(trainer.unwrapped_model.parameters()).device.type == "cuda"
        assert (trainer.unwrapped_model._compiled_call_impl is not None) == compiled
    assert abs(losses[True] - losses[False]) <= 1e-3 * abs(losses[False])


def test_auto_on_the_gpu_times_the_jobs_own_step_and_leaves_the_model_as_it_was(
        tmp_path, tiny_model_dir, monkeypatch, caplog):
    monkeypatch.delenv(PIN_VARIABLE)
    train, test = toy_datasets(tmp_path, tiny_model_dir)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level("INFO", logger="nlptrain"):
        trainer = Trainer(model, train, test, config=TrainConfig(epochs=1, batch_size=8))
    probe = trainer.precision.probe
    assert trainer.config.precision == ("bf16" if probe["bf16_speedup"] >= 1 else "fp32")
    assert "the job's step (batch 8x" in caplog.text and torch.cuda.get_device_name() in caplog.text
    assert probe["probe_ms"] < 5000, probe
    assert all(torch.equal(v.cpu(), weights[k]) for k, v in trainer.unwrapped_model.state_dict().items())
    assert all(p.grad is None for p in trainer.unwrapped_model.parameters())
    assert trainer.fit()["rows"] == len(test)


def test_activation_checkpointing_on_the_gpu_holds_less_and_trains_alike(tmp_path, tiny_model_dir):
    """A 4-layer tiny BERT at 32 x 128: the peak allocated memory of a step falls, and the weights
    move as without it (dropout on: the recomputation restores the CUDA RNG; other masks would
    move them apart by tens of percent, the GPU's non-deterministic sums by far less than 5%)."""
    from transformers import BertConfig, BertForSequenceClassification

    from nlptrain.data import TokenizedDataset

    rows = 32 * 4
    ids = np.random.default_rng(0).integers(1000, 20000, rows * 128).astype(np.int32)
    data = TokenizedDataset(ids, np.arange(0, rows * 128 + 1, 128), np.zeros(rows, dtype=np.int64))
    found = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024))
        start = {k: v.float().clone() for k, v in model.state_dict().items()}
        torch.cuda.reset_peak_memory_stats()
        trainer = Trainer(model, data, None, collate=Collator(0, pad_to=128), config=TrainConfig(
            epochs=1, batch_size=32, precision="fp32", activation_checkpointing=checkpointed))
        trainer.fit()
        found[checkpointed] = (torch.cuda.max_memory_allocated(),
                               {k: v.float().cpu() - start[k] for k, v in model.state_dict().items()})
        trainer.close()
        del trainer, model
        torch.cuda.empty_cache()
    assert found[True][0] < 0.8 * found[False][0], (found[True][0], found[False][0])
    moved, moved_too = (torch.cat([d.flatten() for d in found[c][1].values()]) for c in (False, True))
    assert (moved - moved_too).norm() < 0.05 * moved.norm()
