"""Distributed evaluation is exact: every rank's predictions gathered in row order equal one
process's, whatever the world size, also where a rank scores no row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ddp import run_ranks
from toy_trainer import toy_datasets

from nlptrain.data import Collator
from nlptrain.evaluate import compute_metrics, predict
from nlptrain.models import load_model


def eval_worker(rank: int, world: int, folder: str, model_dir: str, rows: int) -> dict:
    from nlptrain import distributed

    dist = distributed.from_env()
    own = Path(folder) / f"w{world}-rank{rank}"
    own.mkdir(exist_ok=True)
    _, test = toy_datasets(own, Path(model_dir), rows=4, test_rows=rows)
    torch.manual_seed(0)
    model = load_model(model_dir, ["neg", "pos"])  # same seed: same head on every rank and run
    found = predict(model, test, dist, Collator(0), batch_size=64)
    dist.close()
    return compute_metrics(found, ["neg", "pos"]) | {"probs": found.outputs}


def test_distributed_evaluation_equals_one_process_exactly(tmp_path, tiny_model_dir):
    rows = 1067  # divisible by neither 2 nor 3
    by_world = {w: run_ranks(eval_worker, w, tmp_path, str(tmp_path), str(tiny_model_dir), rows)
                for w in (2, 3)}
    reference = eval_worker(0, 1, str(tmp_path), str(tiny_model_dir), rows)  # one process: here
    assert reference["rows"] == rows
    for world in (2, 3):
        for result in by_world[world]:
            for key in ("rows", "correct", "accuracy", "macro_f1", "confusion_matrix", "per_class"):
                assert result[key] == reference[key], (world, key)
            assert torch.allclose(torch.from_numpy(result["probs"]),
                                  torch.from_numpy(reference["probs"]), atol=1e-5)


def empty_share_worker(rank: int, world: int) -> dict:
    """Rank 1 has no rows, and a model without a config cannot tell it their width."""
    from nlptrain import distributed

    dist = distributed.from_env(30)
    outputs = torch.arange(6.0).reshape(2, 3) if rank == 0 else torch.zeros(0, 0)
    index = torch.tensor([1, 0]) if rank == 0 else torch.zeros(0, dtype=torch.long)
    found = {"outputs": dist.gather(outputs), "index": dist.gather(index)}
    dist.close()
    return found


def test_a_rank_with_no_rows_gathers_with_the_others(tmp_path):
    for found in run_ranks(empty_share_worker, 2, tmp_path, timeout=90):
        assert torch.equal(found["outputs"], torch.arange(6.0).reshape(2, 3))
        assert found["index"].tolist() == [1, 0]


def user_typed_labels_worker(rank: int, world: int, model_dir: str, dtype: str) -> list:
    """Three rows, one batch: rank 1 scores none, and sends an empty block of the set's labels."""
    from nlptrain import distributed
    from nlptrain.data import TokenizedDataset
    from nlptrain.kinds import Regression, SingleLabel
    from nlptrain.models import load_tokenizer

    dist = distributed.from_env(30)
    kind, names = (Regression(), []) if dtype == "float64" else (SingleLabel(), ["neg", "pos"])
    test = TokenizedDataset.from_texts(["a", "b c", "d"], np.array([0, 1, 1], dtype=dtype),
                                       load_tokenizer(model_dir), max_length=8)
    found = predict(load_model(model_dir, names, kind=kind), test, dist, Collator(0), kind=kind)
    dist.close()
    return found.labels.tolist()


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_a_rank_with_no_rows_gathers_labels_of_a_users_own_type(tmp_path, tiny_model_dir, dtype):
    """int32 class ids or float64 scores (numpy's, pandas'): the empty share sent them as they
    were, the others as the collator made them, and gloo aborted the job on the sizes."""
    for labels in run_ranks(user_typed_labels_worker, 2, tmp_path, str(tiny_model_dir), dtype,
                            timeout=120):
        assert labels == [0, 1, 1]


def test_the_time_left_in_a_scoring_is_told_by_the_work_left(monkeypatch, caplog):
    """The longest batches come first: a time per batch from them said 2-4x too long. With a
    model whose time is its padded tokens, the estimate after the first batch is exact."""
    import logging
    from types import SimpleNamespace

    import nlptrain.evaluate
    from nlptrain.data import TokenizedDataset
    from nlptrain.distributed import SingleProcess

    clock = SimpleNamespace(now=0.0)

    class TokenTimed(torch.nn.Module):
        def forward(self, input_ids, **_):
            clock.now += input_ids.numel()  # a second a padded token
            return torch.zeros(len(input_ids), 2)

    monkeypatch.setattr(nlptrain.evaluate, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(nlptrain.evaluate, "PROGRESS_EVERY_S", 0.0)
    lengths = [40] * 4 + [10] * 8 + [5] * 4  # batches of 4: 160, 40, 40 and 20 padded tokens
    ids = np.concatenate([np.arange(1, n + 1, dtype=np.int32) for n in lengths])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = TokenizedDataset(ids, offsets, np.zeros(len(lengths), dtype=np.int64))
    with caplog.at_level(logging.INFO, logger="nlptrain"):
        predict(TokenTimed(), data, SingleProcess(), Collator(0), batch_size=4)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scoring:")]
    assert said[0] == "scoring: batch 1/4 (25%), about 100 s left", said  # 40 + 40 + 20 tokens
    assert said[-1].endswith("(100%), about 0 s left")
