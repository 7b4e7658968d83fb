"""The loop's own device work a step is a handful of small ops. On a GPU at small batches the
step is launch-bound (MiniLM at batch 16 on an H200: ~600 kernels a step), so each op the loop
adds around the model's costs about what one of the model's does. Counted here on the CPU by a
dispatch mode, against a bare step on the same batches; view ops (no kernel) are left out."""

from __future__ import annotations

from collections import Counter

import torch
from nlptrain.callbacks import MetricLogger
from torch.utils._python_dispatch import TorchDispatchMode
from toy_trainer import toy_datasets

from nlptrain import Callback, TrainConfig, Trainer
from nlptrain.models import load_model

STEPS = range(2, 5)  # counted between the end of step 2 and that of step 5: past the first


class KernelCount(TorchDispatchMode):
    """Ops that would launch a kernel on a GPU: not views, not the profiler's marks."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        host_only = func.is_view or func.namespace == "profiler" or \
            func.__name__.split(".")[0] in ("lift_fresh", "_local_scalar_dense", "detach")
        if not host_only:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _param_groups(model: torch.nn.Module) -> list[dict]:
    """AdamW's two groups as nlptrain makes them: no weight decay on biases and LayerNorms."""
    decay, plain = [], []
    for p in model.parameters():
        (plain if p.ndim < 2 else decay).append(p)
    return [{"params": decay}, {"params": plain, "weight_decay": 0.0}]


def _nlptrain_counts(tmp_path, model_dir, train) -> tuple[list[Counter], list[dict]]:
    counting, at_step_end, batches = KernelCount(), [], []

    class Watch(Callback):
        def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
            batches.append(dict(batch))  # (a clone would be counted)

        def on_step_end(self, trainer: Trainer) -> None:
            at_step_end.append(Counter(counting.ops))

    torch.manual_seed(0)
    config = TrainConfig(epochs=1, batch_size=4, max_grad_norm=0.0, cpu_dropout=False, log_every=1000)
    trainer = Trainer(load_model(str(model_dir), ["neg", "pos"]), train, config=config,
                      callbacks=[Watch(), MetricLogger(tmp_path / "metrics.jsonl", log_every=1000)])
    with counting:
        trainer.fit()
    trainer.close()
    return at_step_end, batches


def _bare_counts(model_dir, batches: list[dict]) -> list[Counter]:
    """The hand-written step on the batches nlptrain's loop trained on: forward, cross-entropy,
    backward, fused AdamW, grads set to None."""
    torch.manual_seed(0)
    model = load_model(str(model_dir), ["neg", "pos"]).train()
    optimizer = torch.optim.AdamW(_param_groups(model), lr=5e-5, fused=True)
    counting, at_step_end = KernelCount(), []
    with counting:
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            torch.nn.functional.cross_entropy(logits, batch["labels"]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            at_step_end.append(Counter(counting.ops))
    return at_step_end


def test_the_loop_adds_a_few_device_ops_a_step_to_the_bare_steps(tmp_path, tiny_model_dir):
    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=24)
    ours, batches = _nlptrain_counts(tmp_path, tiny_model_dir, train)
    bare = _bare_counts(tiny_model_dir, batches)
    first, last = STEPS.start - 1, STEPS.stop - 1
    ours_a_step = ours[last] - ours[first]
    bare_a_step = bare[last] - bare[first]
    steps = len(STEPS)
    added = (ours_a_step - bare_a_step)
    per_step = sum(added.values()) / steps
    # The window's loss (to float64, x rows: 2), the flags vector (cat: 1), fused AdamW's skip
    # flag (x 0, isnan, to float: 3) and the step counts it takes back where the flag is set
    # (one _foreach_sub_ a parameter group: 2), the logger's step loss (div, clamp: 2).
    assert per_step <= 10, (per_step, sorted(added.items()), dict(bare_a_step - ours_a_step))
    assert not (bare_a_step - ours_a_step) - Counter(), "the bare step has ops ours lacks"
