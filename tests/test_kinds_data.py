"""Every data path keeps a kind's targets and a pair's second text: the token cache, streaming,
per-rank files from `split`, and an exact mid-epoch resume."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import REPO
from kinds_data import write_kind_task
from nlptrain.callbacks import PerRankData
from safetensors.torch import load_file

from nlptrain.cli import main
from nlptrain.data import TokenizedDataset, build_datasets
from nlptrain.data.split import Manifest, split_task
from nlptrain.data.streaming import StreamingDataset
from nlptrain.models import load_tokenizer
from nlptrain.task_files import load_task


def rows_of(dataset) -> list[tuple]:
    """(token ids, type ids, target) of every row, comparable across dataset types."""
    out = []
    for i in range(len(dataset)):
        item = dataset[i]
        types = item.get("token_type_ids")
        out.append((list(item["input_ids"]), None if types is None else list(types),
                    np.asarray(item["labels"]).tolist()))
    return out


@pytest.mark.parametrize("kind", ["pair", "multi_label", "regression"])
def test_the_token_cache_keeps_targets_and_type_ids(tmp_path, tiny_model_dir, kind):
    task = load_task(write_kind_task(tmp_path, tiny_model_dir, kind))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    built = build_datasets(task, tokenizer)
    cached = build_datasets(task, tokenizer)  # from the cache this time
    assert isinstance(cached.train.ids, np.memmap)
    assert rows_of(cached.train) == rows_of(built.train) and len(built.train) == 120
    dtype = {"pair": np.int64, "multi_label": np.float32, "regression": np.float32}[kind]
    assert cached.train.labels.dtype == dtype
    assert (cached.train.type_ids is not None) == (kind != "multi_label")


def test_targets_given_as_a_list_keep_their_kind(tiny_model_dir):
    """Scores in a Python list stay scores (3.8, not 3), float32 like those read from a file;
    multi-hot rows float32, class ids int64."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    scores = TokenizedDataset.from_texts(["a", "b"], [3.8, 0.5], tokenizer, 8).labels
    assert scores.dtype == np.float32 and scores.tolist() == pytest.approx([3.8, 0.5])
    hot = TokenizedDataset.from_texts(["a", "b"], [[1.0, 0.0], [1.0, 1.0]], tokenizer, 8).labels
    assert hot.dtype == np.float32 and hot.tolist() == [[1, 0], [1, 1]]
    ids = TokenizedDataset.from_texts(["a", "b"], [1, 0], tokenizer, 8).labels
    assert ids.dtype == np.int64 and ids.tolist() == [1, 0]


def test_a_stream_yields_what_the_in_memory_set_holds(tmp_path, tiny_model_dir):
    for kind in ("pair", "regression", "multi_label", "multi_label_tsv"):
        (tmp_path / kind).mkdir()
        task = load_task(write_kind_task(tmp_path / kind, tiny_model_dir, kind))
        tokenizer = load_tokenizer(str(tiny_model_dir))
        sets = build_datasets(task, tokenizer, use_cache=False)
        stream = StreamingDataset.from_task(task, sets.vocab, tokenizer,
                                            SimpleNamespace(rank=0, world_size=1))
        stream.shuffle_buffer = 0
        streamed = sorted(((r["index"], r) for r in stream), key=lambda pair: pair[0])
        expected = rows_of(sets.train)
        assert [(list(r["input_ids"]), None if "token_type_ids" not in r
                 else list(r["token_type_ids"]), np.asarray(r["labels"]).tolist())
                for _, r in streamed] == expected, kind


def test_per_rank_files_keep_pairs_and_label_lists(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    for kind in ("pair", "multi_label", "multi_label_tsv"):
        folder = tmp_path / kind
        folder.mkdir()
        task = load_task(write_kind_task(folder, tiny_model_dir, kind))
        manifest = split_task(task, folder / "parts", 2)
        assert manifest.labels == (["differ", "same"] if kind == "pair"
                                   else ["food", "music", "sport"])
        sets = build_datasets(task, tokenizer, use_cache=False)
        task.data.train_shards = "parts"
        callback = PerRankData.from_task(task, sets.vocab, use_cache=False)
        trainer = SimpleNamespace(tokenizer=tokenizer, label_names=sets.vocab.names)
        parts = [callback._load(Manifest.load(folder / "parts").part_path(folder / "parts", r),
                                trainer) for r in range(2)]
        whole = rows_of(sets.train)
        # Rows are dealt round-robin: part r holds rows r, r + 2, ...
        assert rows_of(parts[0]) == whole[0::2] and rows_of(parts[1]) == whole[1::2]


def test_a_regression_pair_run_resumes_exactly_mid_epoch(tmp_path, tiny_model_dir, monkeypatch):
    task = write_kind_task(tmp_path, tiny_model_dir, "regression")
    scaffold = f"{REPO / 'tests' / 'scaffold_callbacks.py'}:RaiseAtStep"
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    args = ["train", "--task", str(task), "--checkpoint-every", "4"]
    assert main([*args, "--output-dir", str(whole)]) == 0
    monkeypatch.setenv("AT_STEP", "22")  # epoch 2 of 2 (15 steps an epoch); checkpoint at 20
    with pytest.raises(RuntimeError, match="injected crash at step 22"):
        main([*args, "--output-dir", str(crashed), "--callback", scaffold])
    assert main([*args, "--output-dir", str(crashed), "--resume"]) == 0
    a, b = (load_file(run / "model" / "model.safetensors") for run in (whole, crashed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    results = [json.loads((run / "results.json").read_text())["test"] for run in (whole, crashed)]
    assert results[0] == results[1] and "pearson" in results[0]
