"""The trainer adds no arithmetic of its own: it steps exactly like a hand-written loop, and
two DDP ranks train exactly like one process holding the global batch.

Dropout is off in both tests so that the comparison is of the loop, not of random masks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp import run_ranks
from toy_trainer import toy_datasets

from nlptrain import Callback, DistTrainer, TrainConfig, Trainer
from nlptrain.data import Collator
from nlptrain.evaluate import logits_of, model_inputs
from nlptrain.models import load_model
from nlptrain.samplers import TokenBudgetSampler

BATCH = 8


class RecordLoss(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_loss(self, trainer, loss) -> None:
        self.losses.append(loss.item())


def model_without_dropout(model_dir: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    model = load_model(str(model_dir), ["neg", "pos"])
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def test_trainer_steps_exactly_like_a_hand_written_loop(tmp_path, tiny_model_dir):
    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=40)
    collate = Collator(0)

    # The loop of the PyTorch tutorial: DistributedSampler order, AdamW at a constant lr.
    model = model_without_dropout(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    sampler = torch.utils.data.DistributedSampler(train, num_replicas=1, rank=0, seed=42)
    sampler.set_epoch(0)
    hand_losses = []
    model.train()
    for batch in torch.utils.data.DataLoader(train, batch_size=BATCH, sampler=sampler,
                                             collate_fn=collate):
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     labels=batch["labels"]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        hand_losses.append(loss.item())

    # The same job on the trainer: no grouping, no schedule, no clipping, no weight decay.
    config = TrainConfig(epochs=1, batch_size=BATCH, lr=1e-3, weight_decay=0.0, seed=42,
                         scheduler="constant", warmup_ratio=0.0, max_grad_norm=0.0,
                         group_by_length=False)
    record = RecordLoss()
    trainer = Trainer(model_without_dropout(tiny_model_dir), train, None, config=config,
                      callbacks=[record], collate=collate)
    trainer.fit()
    trainer.close()

    assert len(hand_losses) == 5
    assert record.losses == hand_losses
    for (name, mine), theirs in zip(trainer.unwrapped_model.named_parameters(),
                                    model.parameters(), strict=True):
        assert torch.equal(mine, theirs), name


def global_batch_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    own = Path(folder) / f"rank{rank}"
    own.mkdir(exist_ok=True)
    train, _ = toy_datasets(own, Path(model_dir), rows=48)
    # Every default (length grouping, dynamic padding, warmup + linear decay, clipping, weight
    # decay), only the batch is split: BATCH // world rows per rank.
    config = TrainConfig(epochs=2, batch_size=BATCH // world, lr=1e-3, seed=3, timeout=60)
    record = RecordLoss()
    trainer = DistTrainer(model_without_dropout(Path(model_dir)), train, None, config=config,
                          callbacks=[record])
    trainer.fit()
    params = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    trainer.close()
    return {"params": params, "losses": record.losses}


@pytest.mark.distributed
def test_two_ranks_train_like_one_process_with_the_global_batch(tmp_path, tiny_model_dir):
    ranks = run_ranks(global_batch_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    (tmp_path / "single").mkdir()
    train, _ = toy_datasets(tmp_path / "single", tiny_model_dir, rows=48)
    config = TrainConfig(epochs=2, batch_size=BATCH, lr=1e-3, seed=3)
    record = RecordLoss()
    single = Trainer(model_without_dropout(tiny_model_dir), train, None, config=config,
                     callbacks=[record])
    single.fit()
    single.close()

    # Each step the ranks' batches together are the single process's batch...
    assert len(record.losses) == len(ranks[0]["losses"]) == 12
    for step, whole in enumerate(record.losses):
        halves = (ranks[0]["losses"][step] + ranks[1]["losses"][step]) / 2
        assert abs(halves - whole) < 1e-5, step
    # ...so the averaged gradients, the clipping and every update are the same.
    gaps = {name: (ranks[0]["params"][name] - value).abs().max().item()
            for name, value in single.unwrapped_model.state_dict().items()}
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] < 1e-6, f"{worst} differs by {gaps[worst]:.2e}"


class WindowGradients(Callback):
    """Each micro-batch's gradient of its own mean loss alone and its rows, and each optimizer
    step's accumulated gradient (all-reduced, under DDP) with the micro-batches seen by then.
    The gradient alone comes from a forward of the unwrapped model: DDP's hooks never see it."""

    def __init__(self) -> None:
        self.alone: list[list[torch.Tensor]] = []
        self.rows: list[int] = []
        self.steps: list[tuple[int, list[torch.Tensor]]] = []

    def on_loss(self, trainer, loss) -> None:
        model, batch = trainer.unwrapped_model, trainer.batch
        params = list(model.parameters())
        own = trainer.loss_fn(logits_of(model(**model_inputs(batch))), batch["labels"])
        grads = torch.autograd.grad(own, params, allow_unused=True)
        self.alone.append(_dense(grads, params))
        self.rows.append(len(batch["labels"]))

    def on_backward_end(self, trainer) -> None:
        if trainer.is_update_step:
            params = list(trainer.unwrapped_model.parameters())
            self.steps.append((len(self.alone), _dense([p.grad for p in params], params)))


def _dense(grads, params) -> list[torch.Tensor]:
    """Gradients, zeros for parameters that had none (e.g. an unused pooler)."""
    return [torch.zeros_like(p) if g is None else g.clone() for g, p in zip(grads, params,
                                                                             strict=True)]


def test_each_step_is_the_mean_gradient_of_its_micro_batches_a_short_last_one_too(
        tmp_path, tiny_model_dir):
    """3 micro-batches an epoch, grad_accum 2: the steps are of 2 and 1 micro-batches, and each
    step's gradient is the mean of its own (the short one is not halved)."""
    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=24)
    spy = WindowGradients()
    config = TrainConfig(epochs=1, batch_size=BATCH, grad_accum=2, lr=1e-3, max_grad_norm=0.0)
    trainer = Trainer(model_without_dropout(tiny_model_dir), train, None, config=config,
                      callbacks=[spy])
    trainer.fit()
    trainer.close()
    assert [seen for seen, _ in spy.steps] == [2, 3]
    windows = [spy.alone[0:2], spy.alone[2:3]]
    for (_, accumulated), window in zip(spy.steps, windows, strict=True):
        for got, *own in zip(accumulated, *window, strict=True):
            torch.testing.assert_close(got, sum(own) / len(own))


def _row_weighted(grads: list[list[torch.Tensor]], rows: list[int]) -> list[torch.Tensor]:
    """The gradient of the mean loss over all the rows of `grads`' micro-batches together."""
    return [sum(g * r for g, r in zip(own, rows, strict=True)) / sum(rows)
            for own in zip(*grads, strict=True)]


@pytest.mark.parametrize("rows, settings", [
    (20, {"batch_size": BATCH, "grad_accum": 3}),  # one window of 8, 8 and 4 rows
    (40, {"max_tokens": 96, "grad_accum": 2}),  # a token budget's batches: rows by length
])
def test_a_step_weighs_each_micro_batch_by_its_rows(tmp_path, tiny_model_dir, rows, settings):
    """A step's gradient is the mean over its rows, as one process taking them at once: a short
    micro-batch (an epoch's last; a token budget's few long rows) weighs as its rows do, not as
    much as a full one (the mean of micro-batch means; fairseq and transformers divide by the
    step's rows)."""
    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=rows)
    spy = WindowGradients()
    config = TrainConfig(epochs=1, lr=1e-3, max_grad_norm=0.0, **settings)
    trainer = Trainer(model_without_dropout(tiny_model_dir), train, None, config=config,
                      callbacks=[spy], progress=False)
    trainer.fit()
    trainer.close()
    assert len(set(spy.rows)) > 1, spy.rows  # else any weighting is the same
    begin = 0
    for seen, accumulated in spy.steps:
        expected = _row_weighted(spy.alone[begin:seen], spy.rows[begin:seen])
        for got, want in zip(accumulated, expected, strict=True):
            torch.testing.assert_close(got, want)
        begin = seen
    assert begin == len(spy.rows) == trainer.batches_per_epoch


def _spied_steps(model_dir: str, train, **settings) -> dict:
    """3 optimizer steps of a DistTrainer on `train`: each micro-batch's own gradient and rows,
    and each step's accumulated gradient (`WindowGradients`)."""
    spy = WindowGradients()
    config = TrainConfig(epochs=1, max_steps=3, lr=1e-3, max_grad_norm=0.0, timeout=60, **settings)
    trainer = DistTrainer(model_without_dropout(Path(model_dir)), train, None, config=config,
                          callbacks=[spy], progress=False)
    trainer.fit()
    trainer.close()
    return {"alone": spy.alone, "rows": spy.rows, "steps": [grads for _, grads in spy.steps]}


def _rank_rows(rank: int, folder: str, model_dir: str):
    own = Path(folder) / f"rank{rank}"
    own.mkdir(exist_ok=True)
    return toy_datasets(own, Path(model_dir), rows=48)[0]


def token_budget_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    return _spied_steps(model_dir, _rank_rows(rank, folder, model_dir), max_tokens=96)


@pytest.mark.distributed
def test_ranks_batches_of_a_token_budget_weigh_by_their_rows(tmp_path, tiny_model_dir):
    """Two ranks' batches of a token budget hold different rows (long texts few, short many):
    the averaged gradient is the mean over the step's rows of both, with no collective more."""
    ranks = run_ranks(token_budget_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    steps = list(zip(ranks[0]["rows"], ranks[1]["rows"], strict=True))
    assert any(first != second for first, second in steps), steps
    for step, rows in enumerate(steps):
        expected = _row_weighted([ranks[0]["alone"][step], ranks[1]["alone"][step]], list(rows))
        for rank in ranks:
            for got, want in zip(rank["steps"][step], expected, strict=True):
                torch.testing.assert_close(got, want)


def own_budget_loader_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    train = _rank_rows(rank, folder, model_dir)
    # The user's own loader over nlptrain's sampler, of one replica, seeded by rank: each rank
    # reads its own order (as per-rank data would), unknown to the trainer.
    batches = TokenBudgetSampler(train.lengths, 96, seed=rank)
    loader = torch.utils.data.DataLoader(train, batch_sampler=batches, collate_fn=Collator(0))
    return _spied_steps(model_dir, loader)


@pytest.mark.distributed
def test_a_loader_of_ones_own_over_nlptrains_sampler_weighs_its_batches_alike(tmp_path, tiny_model_dir):
    """A user's loader has no plan the trainer knows, even over nlptrain's TokenBudgetSampler (of
    one replica here): it was taken for the trainer's own, the plan of one rank's batches read
    as two ranks' (a crash on an odd count). Its batches weigh alike, as documented."""
    ranks = run_ranks(own_budget_loader_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    steps = list(zip(ranks[0]["rows"], ranks[1]["rows"], strict=True))
    assert len(steps) == 3 and any(first != second for first, second in steps), steps
    for step in range(3):
        expected = _row_weighted([ranks[0]["alone"][step], ranks[1]["alone"][step]], [1, 1])
        for got, want in zip(ranks[0]["steps"][step], expected, strict=True):
            torch.testing.assert_close(got, want)


def test_two_python_runs_of_one_seed_train_alike_dropout_included(tmp_path, tiny_model_dir):
    """The seed decides dropout's masks, as the README says: the command line seeded the
    generators, a Trainer did not, and torch starts each process from its own seed."""
    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=24)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    first = {k: v.clone() for k, v in model.state_dict().items()}
    runs = []
    for draw in (1, 2):
        torch.manual_seed(draw)  # where the generators were left: anything
        model.load_state_dict(first)
        trainer = Trainer(model, train, config=TrainConfig(epochs=1, batch_size=8, seed=7),
                          progress=False)
        trainer.fit()
        runs.append({k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()})
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
