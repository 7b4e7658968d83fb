"""The three training loops that bench/gpu_bench.py times on the same model, rows and batch shape.

- `bare`: the tight hand-written step (autocast, fused AdamW, pinned rows, non-blocking copies),
  its forwards in nlptrain's forward context (`nlptrain.precision.autocast`: on a GPU in bf16,
  attention without cuDNN's kernel), so that "vs bare" is the cost of the loop around the same
  kernels;
- `nlptrain`: nlptrain's own loop, `Trainer(...).fit()`, with its defaults on the device;
- `hf`: `transformers.Trainer`, bf16 and fused AdamW, pinned memory;
- `bare+compile`, `nlptrain+compile`: the first two with the model under `torch.compile`
  (nlptrain's `compile = true`); the compiling falls in the untimed warm-up steps.

All three do the same work per step: every row padded to `seq` tokens, AdamW at lr 2e-5 without
weight decay, no gradient clipping, no warm-up. Each runs `warmup` untimed steps, then `steps`
timed ones between two device synchronizations, and returns the timed seconds.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import torch

PRECISION_OF = {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}  # autocast dtype


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Starts after `warmup` steps and stops after `warmup + steps`, each at a device sync."""

    def __init__(self, warmup: int, steps: int, device: torch.device) -> None:
        self.warmup, self.steps, self.device = warmup, steps, device
        self.done = 0
        self.start = self.seconds = 0.0

    def step_ended(self) -> bool:
        """Count a finished step; True once the timed steps are all done."""
        self.done += 1
        if self.done == self.warmup:
            _sync(self.device)
            self.start = time.perf_counter()
        elif self.done == self.warmup + self.steps:
            _sync(self.device)
            self.seconds = time.perf_counter() - self.start
        return self.done >= self.warmup + self.steps


def rows_for(data: tuple, batch: int, total_steps: int) -> tuple[torch.Tensor, ...]:
    """The benchmark rows tiled so that one epoch holds every step (no epoch boundary timed)."""
    ids, mask, labels = data[:3]
    need = batch * (total_steps + 1)
    reps = -(-need // ids.shape[0])
    return tuple(t.repeat(reps, *([1] * (t.dim() - 1))) for t in (ids, mask, labels))


def bare(model, data: tuple, batch: int, warmup: int, steps: int, device: torch.device,
         dtype: torch.dtype | None, compile: bool = False) -> float:
    ids, mask, labels = rows_for(data, batch, warmup + steps)
    if compile:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0,
                                  fused=True)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    pin = device.type == "cuda"
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(0))
    from nlptrain.precision import autocast

    precision = PRECISION_OF[dtype]
    clock = StepClock(warmup, steps, device)
    for begin in range(0, ids.shape[0], batch):
        pick = order[begin:begin + batch]
        rows = [t[pick] for t in (ids, mask, labels)]  # fancy indexing copies: pin the copy
        b_ids, b_mask, b_labels = ((r.pin_memory() if pin else r).to(device, non_blocking=True)
                                   for r in rows)
        with autocast(device, precision):
            loss = model(input_ids=b_ids, attention_mask=b_mask, labels=b_labels).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if clock.step_ended():
            break
    return clock.seconds


def nlptrain(model, data: tuple, batch: int, warmup: int, steps: int, device: torch.device,
             dtype: torch.dtype | None, compile: bool = False) -> float:
    from nlptrain import Callback, TrainConfig, Trainer
    from nlptrain.data import Collator, TokenizedDataset

    ids, mask, labels = rows_for(data, batch, warmup + steps)
    lengths = mask.sum(1).numpy()
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = TokenizedDataset(ids[mask.bool()].numpy().astype(np.int32), offsets, labels.numpy())
    clock = StepClock(warmup, steps, device)

    class Clock(Callback):
        def on_step_end(self, trainer: Trainer) -> None:
            if clock.step_ended():
                trainer.should_stop = True

    precision = PRECISION_OF[dtype]
    config = TrainConfig(epochs=1, batch_size=batch, lr=2e-5, weight_decay=0.0, warmup_ratio=0.0,
                         max_grad_norm=0.0, precision=precision, group_by_length=False, cpu_dropout=False,
                         compile=compile)
    trainer = Trainer(model, rows, None, config=config, callbacks=[Clock()],
                      collate=Collator(0, pad_to=ids.shape[1]))
    trainer.fit()
    trainer.close()
    return clock.seconds


def hf(model, data: tuple, batch: int, warmup: int, steps: int, device: torch.device,
       dtype: torch.dtype | None) -> float:
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments

    ids, mask, labels = rows_for(data, batch, warmup + steps)
    clock = StepClock(warmup, steps, device)

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return ids.shape[0]

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs) -> None:
            clock.step_ended()

    settings = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="gpu-bench-hf-"), max_steps=warmup + steps,
        per_device_train_batch_size=batch, learning_rate=2e-5, weight_decay=0.0, warmup_steps=0,
        max_grad_norm=0.0, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch",
        use_cpu=device.type == "cpu", dataloader_pin_memory=device.type == "cuda",
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[],
        disable_tqdm=True, seed=0)
    Trainer(model=model, args=settings, train_dataset=Rows(), callbacks=[Clock()]).train()
    return clock.seconds


LOOPS = {"bare": bare, "nlptrain": nlptrain, "hf": hf,
         "bare+compile": functools.partial(bare, compile=True),
         "nlptrain+compile": functools.partial(nlptrain, compile=True)}
