"""DDP on a CPU all-reduces only the word-embedding rows some rank touched, and trains exactly
as the dense all-reduce does (`nlptrain.cpu_gradient_sync`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp import run_ranks
from toy_trainer import toy_datasets

from nlptrain import Callback, DistTrainer, TrainConfig
from nlptrain.cpu_gradient_sync import input_embedding_weight
from nlptrain.models import load_model

pytestmark = pytest.mark.distributed


class RowsSent(Callback):
    """The rows the hook all-reduced at each optimizer step."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def on_step_end(self, trainer) -> None:
        self.rows.append(trainer.strategy.gradient_sync.rows_sent)


def train_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    own = Path(folder) / f"rank{rank}"
    own.mkdir(exist_ok=True)
    train, _ = toy_datasets(own, Path(model_dir), rows=40)
    out = {}
    for grad_accum in (1, 2):
        for touched in (False, True):
            torch.manual_seed(0)
            model = load_model(model_dir, ["neg", "pos"])  # dropout on: masks from the seed
            config = TrainConfig(epochs=1, batch_size=4, lr=1e-3, seed=5, timeout=60,
                                 grad_accum=grad_accum, sync_touched_rows=touched,
                                 shared_memory_all_reduce=False)  # gloo: rows alone
            rows = RowsSent()
            trainer = DistTrainer(model, train, None, config=config,
                                  callbacks=[rows] if touched else [])
            trainer.fit()
            out[grad_accum, touched] = {
                "params": {k: v.detach().clone() for k, v in
                           trainer.unwrapped_model.state_dict().items()},
                "rows": rows.rows, "vocab": trainer.unwrapped_model.config.vocab_size}
            trainer.close()
    return out


def test_touched_rows_train_bit_for_bit_like_the_dense_all_reduce(tmp_path, tiny_model_dir):
    ranks = run_ranks(train_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    for grad_accum in (1, 2):
        dense, touched = ranks[0][grad_accum, False], ranks[0][grad_accum, True]
        # Each step sent a few dozen of the 30,522 rows: the union of both ranks' tokens...
        assert touched["rows"] and all(0 < n < touched["vocab"] // 100 for n in touched["rows"])
        # ...and every weight, the word embedding's included, is the dense run's to the bit.
        for name, value in dense["params"].items():
            assert torch.equal(touched["params"][name], value), (grad_accum, name)
        assert torch.equal(ranks[1][grad_accum, True]["params"]["bert.embeddings.word_embeddings"
                                                            ".weight"],
                           dense["params"]["bert.embeddings.word_embeddings.weight"])


def test_only_a_trainable_embedding_layer_is_synced_by_rows(tiny_model_dir):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    assert input_embedding_weight(model) is model.bert.embeddings.word_embeddings.weight
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)  # frozen: no gradient
    assert input_embedding_weight(model) is None
    assert input_embedding_weight(torch.nn.Linear(2, 2)) is None  # not a transformers model


class EmbeddingThenHead(torch.nn.Module):
    """A table and a head: in DDP's first bucket layout (the parameters' order) the embedding's
    gradient comes before the head's; once rebuilt (the order gradients are ready in), last."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(500, 8)
        self.head = torch.nn.Linear(8, 3)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).tanh()).sum()


def hook_worker(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from nlptrain.cpu_gradient_sync import register_cpu_gradient_sync

    dist.init_process_group("gloo")
    ids = torch.randint(0, 500, (4, 6), generator=torch.Generator().manual_seed(rank))
    out: dict = {}
    for levers in (None, (True, False), (True, True)):  # dense; rows over gloo; rows through /dev/shm
        torch.manual_seed(0)
        ddp = DistributedDataParallel(EmbeddingThenHead(), gradient_as_bucket_view=True)
        hook = register_cpu_gradient_sync(ddp, *levers) if levers else None
        out[levers] = {"grads": [], "rows": []}
        for _ in range(2):  # DDP's first bucket layout, then the rebuilt one
            ddp.zero_grad()
            ddp(ids).backward()
            out[levers]["grads"].append({n: p.grad.clone() for n, p in ddp.module.named_parameters()})
            out[levers]["rows"].append(hook.rows_sent if hook else None)
    dist.destroy_process_group()
    return out


def test_rows_come_out_right_where_the_embedding_is_not_last_in_its_bucket(tmp_path):
    for rank in run_ranks(hook_worker, 2, tmp_path):
        for step, dense in enumerate(rank[None]["grads"]):
            for levers in ((True, False), (True, True)):
                assert 0 < rank[levers]["rows"][step] <= 2 * 4 * 6  # both ranks' batches' tokens
                for name, grad in dense.items():
                    assert torch.equal(rank[levers]["grads"][step][name], grad), (levers, name)
