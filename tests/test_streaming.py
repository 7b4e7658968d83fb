"""Streaming reader: the same rows as the readers, sharded by rank and worker, each row once per
epoch (also on 2 real ranks x 2 workers through DistTrainer), reshuffled by set_epoch."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import write_toy_tsv
from ddp import run_ranks
from torch.utils.data import DataLoader

from nlptrain import Callback, DistTrainer, TrainConfig, Trainer
from nlptrain.config import FileSpec
from nlptrain.data import Collator
from nlptrain.data.readers import iter_rows
from nlptrain.data.streaming import StreamingDataset, batches_per_rank, prepare_stream
from nlptrain.errors import ConfigError, DataError
from nlptrain.models import load_model, load_tokenizer

LABELS = {"neg": 0, "pos": 1}


def stream(path: Path, tokenizer, rank: int = 0, world: int = 1, **options) -> StreamingDataset:
    spec = FileSpec(path=path.name, format="tsv")
    return StreamingDataset(spec, path.parent, LABELS, tokenizer, 32, rank, world, seed=5, **options)


def epoch_rows(dataset: StreamingDataset, epoch: int, workers: int) -> list[int]:
    dataset.set_epoch(epoch)
    loader = DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=Collator(0))
    return [i for batch in loader for i in batch["index"].tolist()]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_rows_are_read_lazily_with_their_lines(tmp_path, fmt):
    files = {"tsv": 'text\tlabel\nsays "hi"\tpos\n\n  spaced \tneg\n',
             "csv": 'text,label\n"two\nlines, quoted",pos\nplain,neg\n',
             "jsonl": '{"text": "a", "label": "pos"}\n\n{"text": "b\\tc", "label": "neg"}\n'}
    expected = {"tsv": (['says "hi"', "  spaced "], [2, 4]),
                "csv": (["two\nlines, quoted", "plain"], [2, 4]),
                "jsonl": (["a", "b\tc"], [1, 3])}
    path = tmp_path / f"data.{fmt}"
    path.write_text(files[fmt], encoding="utf-8")
    rows = iter_rows(FileSpec(path=path.name), tmp_path)
    first = next(rows)  # a generator: nothing is read past the first row yet
    rows = [first, *rows]
    assert [r.text for r in rows] == expected[fmt][0]
    assert [r.label for r in rows] == ["pos", "neg"]
    assert [(r.path, r.line) for r in rows] == [(str(path), n) for n in expected[fmt][1]]


def test_shards_cover_every_row_once_and_reshuffle(tmp_path, tokenizer):
    path = write_toy_tsv(tmp_path / "train.tsv", 150, seed=2)
    world, workers = 2, 2
    ranks = [stream(path, tokenizer, rank, world, shuffle_buffer=16) for rank in range(world)]
    first = [epoch_rows(d, 0, workers) for d in ranks]
    assert sorted(i for rows in first for i in rows) == list(range(150))  # disjoint, complete
    assert [epoch_rows(d, 0, workers) for d in ranks] == first  # seeded: the same again
    second = [epoch_rows(d, 1, workers) for d in ranks]
    assert sorted(i for rows in second for i in rows) == list(range(150))
    assert second != first  # set_epoch reshuffles
    in_order = stream(path, tokenizer, shuffle_buffer=0)
    assert epoch_rows(in_order, 0, 0) == list(range(150))
    row = next(iter(in_order))
    assert row["labels"] == LABELS[path.read_text().splitlines()[1].split("\t")[1]]
    assert tokenizer.decode(row["input_ids"], skip_special_tokens=True).startswith("row 0 ")


def test_bad_label_is_reported_with_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nfine\tpos\nodd\tmaybe\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train.tsv:3: label 'maybe' is not one of"):
        stream(path, tokenizer).count_rows()


def test_batches_per_rank():
    # 150 rows in 4 shards (38, 38, 37, 37); each worker batches its own shard.
    assert batches_per_rank(150, 2, 2, 8) == [10, 10]
    assert batches_per_rank(150, 2, 2, 8, drop_last=True) == [8, 8]
    assert batches_per_rank(10, 3, 0, 4) == [1, 1, 1]


@pytest.mark.parametrize(("rows", "batch_size", "grad_accum", "cure"), [
    (2, 2, 1, "run fewer processes"), (2, 1, 1, "run fewer processes"),
    (6, 2, 3, "lower batch_size or grad_accum")])
def test_too_few_rows_for_the_ranks_names_a_cure_that_is_left(tmp_path, tokenizer, rows,
                                                              batch_size, grad_accum, cure):
    """2 rows on 3 ranks: no smaller batch gives every rank a row, only fewer ranks do (a lower
    batch_size was named); 6 rows, 2 a rank: smaller steps do. Every rank counts the same rows:
    the error is said once (rank 0)."""
    write_toy_tsv(tmp_path / "few.tsv", rows)
    data = stream(tmp_path / "few.tsv", tokenizer, 0, 3)
    three_ranks = SimpleNamespace(world_size=3, is_main=True, on_main=lambda fn: fn())
    with pytest.raises(ConfigError, match=f"{rows} rows are too few for 3 rank.*; {cure}$") as refused:
        prepare_stream(data, TrainConfig(batch_size=batch_size, grad_accum=grad_accum), three_ranks)
    assert refused.value.raised_on_every_rank


class RecordIndex(Callback):
    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = {}

    def on_batch_start(self, trainer, batch) -> None:
        self.rows.setdefault(trainer.epoch, []).extend(batch["index"].tolist())


def stream_job(rank: int, world: int, path: str, model_dir: str) -> dict:
    from nlptrain import distributed

    # A rank made by spawn would spawn its DataLoader workers too (slow: each imports torch);
    # under torchrun a rank is a fresh interpreter whose workers fork. Do as torchrun does.
    multiprocessing.set_start_method("fork", force=True)
    tokenizer = load_tokenizer(model_dir)
    dist = distributed.from_env(60)
    data = stream(Path(path), tokenizer, dist.rank, dist.world_size, shuffle_buffer=16)
    config = prepare_stream(data, TrainConfig(epochs=2, batch_size=8, lr=1e-3, num_workers=2,
                                              timeout=60), dist)
    torch.manual_seed(0)
    record = RecordIndex()
    trainer = DistTrainer(load_model(model_dir, ["neg", "pos"]), data, None, config=config,
                          callbacks=[record], tokenizer=tokenizer, dist=dist)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return {"rows": record.rows, "steps": config.steps_per_epoch, "total": len(data),
            "config": dataclasses.asdict(config)}


def test_two_ranks_two_workers_see_each_row_once_per_epoch(tmp_path, tiny_model_dir):
    path = write_toy_tsv(tmp_path / "train.tsv", 150, seed=3)
    results = run_ranks(stream_job, 2, tmp_path, str(path), str(tiny_model_dir))
    assert [r["steps"] for r in results] == [10, 10]  # counted once, agreed by construction
    assert [r["total"] for r in results] == [150, 150]
    for epoch in (0, 1):
        seen = [i for r in results for i in r["rows"][epoch]]
        assert sorted(seen) == list(range(150)), epoch
    assert results[0]["rows"][0] != results[0]["rows"][1]  # workers saw the new epoch


@pytest.mark.parametrize(("steps", "said"), [(2, "the rows past the epoch's share are never trained"),
                                             (9, "an epoch reads rows twice")])
def test_steps_per_epoch_other_than_a_pass_of_a_stream_is_said(tmp_path, tokenizer, caplog, steps,
                                                                said):
    """Each epoch reads a stream from its start: fewer steps than a pass never reach its tail,
    more read rows twice. Said, with the pass's count."""
    write_toy_tsv(tmp_path / "rows.tsv", 40)  # 5 batches of 8: a pass is 5 steps
    one_rank = SimpleNamespace(world_size=1, is_main=True, on_main=lambda fn: fn())
    config = prepare_stream(stream(tmp_path / "rows.tsv", tokenizer), TrainConfig(
        batch_size=8, steps_per_epoch=steps), one_rank)
    assert config.steps_per_epoch == steps
    assert f"streaming 40 rows with steps_per_epoch = {steps}: one pass is 5 steps, and each epoch " \
           f"reads the file from its start, so {said}" in caplog.text
    caplog.clear()
    prepare_stream(stream(tmp_path / "rows.tsv", tokenizer), TrainConfig(batch_size=8,
                                                                         steps_per_epoch=5), one_rank)
    assert "steps_per_epoch" not in caplog.text


def test_a_stream_stopped_mid_epoch_resumes_only_with_the_readers_it_was_read_by(tmp_path,
                                                                                tiny_model_dir):
    """Its rows are dealt to ranks x workers by their count; the resume skips each reader's
    batches done: with another count, some rows would be trained twice and others never."""
    from nlptrain.callbacks import Checkpointer

    from nlptrain import Trainer
    from nlptrain.errors import CheckpointError

    write_toy_tsv(tmp_path / "rows.tsv", 40)
    tokenizer = load_tokenizer(str(tiny_model_dir))

    def trainer(workers: int, **more) -> Trainer:
        config = TrainConfig(batch_size=8, steps_per_epoch=5, num_workers=workers, **more)
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), stream(
            tmp_path / "rows.tsv", tokenizer), config=config, tokenizer=tokenizer, progress=False,
            callbacks=[Checkpointer(tmp_path / "checkpoints", 2)], resume_from=tmp_path / "checkpoints")

    trainer(0, max_steps=2).fit()  # a checkpoint at step 2 of 5
    with pytest.raises(CheckpointError, match=r"a stream stopped mid-epoch resumes only as it was "
                       r"read, by 1 rank\(s\) x 1 DataLoader worker\(s\) \(this job: 1 x 2\)"):
        trainer(2)
    assert trainer(0).global_step == 2  # as it was read: it resumes


class OwnStream(torch.utils.data.IterableDataset):
    """A user's IterableDataset that knows nothing of ranks: rows 0..47, tokenized, in an order
    of each epoch's (set_epoch), each DataLoader worker taking its share as torch's docs ask."""

    def __init__(self, model_dir: str, rows: int = 48) -> None:
        from nlptrain.data import TokenizedDataset

        texts = [f"row number {i}" for i in range(rows)]
        self.rows = TokenizedDataset.from_texts(texts, [i % 2 for i in range(rows)],
                                                load_tokenizer(model_dir), 16)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        import random

        order = list(range(len(self.rows)))
        random.Random(self.epoch).shuffle(order)
        worker = torch.utils.data.get_worker_info()
        return (self.rows[i] for i in (order[worker.id::worker.num_workers] if worker else order))


def own_stream_job(rank: int, world: int, model_dir: str) -> dict:
    from nlptrain import distributed

    dist = distributed.from_env(60)
    record = RecordIndex()
    torch.manual_seed(0)
    trainer = DistTrainer(load_model(model_dir, ["neg", "pos"]), OwnStream(model_dir), None,
                          config=TrainConfig(epochs=1, batch_size=8, timeout=60),  # its len
                          callbacks=[record], dist=dist, progress=False)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return record.rows


def test_an_iterable_dataset_of_your_own_is_sharded_by_rank(tmp_path, tiny_model_dir):
    """Two ranks each running the same __iter__ trained every row twice per epoch, silently
    (the README said IterableDatasets are sharded): each rank now keeps every 2nd item."""
    ranks = run_ranks(own_stream_job, 2, tmp_path, str(tiny_model_dir))
    seen = [i for rows in ranks for i in rows[0]]
    assert sorted(seen) == list(range(48))  # 3 batches a rank, from its len: no steps_per_epoch
    assert len(ranks[0][0]) == len(ranks[1][0]) == 24


def test_an_iterable_dataset_of_your_own_is_read_in_each_epochs_order_by_its_workers(
        tmp_path, tiny_model_dir):
    """Workers kept from one epoch to the next hold the dataset as they got it: set_epoch never
    reached them, and every epoch repeated the first's order (a resume then skipped other rows)."""
    record = RecordIndex()
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), OwnStream(str(tiny_model_dir)),
                      config=TrainConfig(epochs=2, batch_size=8, num_workers=2, steps_per_epoch=6),
                      callbacks=[record],
                      progress=False)
    trainer.fit()
    assert sorted(record.rows[0]) == sorted(record.rows[1]) == list(range(48))
    assert record.rows[0] != record.rows[1]


@pytest.mark.parametrize(("rows", "world"), [(8, 3), (7, 2), (2, 3), (9, 3), (1, 3), (3, 8)])
def test_an_iterable_dataset_of_your_own_leaves_no_row_out_where_ranks_do_not_divide_it(rows,
                                                                                         world):
    """As a DistributedSampler pads: each rank takes as many items, the short shares made up
    with the first items again. The ranks agree on the shortest share, which dropped the longer
    shares' last rows every epoch (8 rows on 3 ranks: rows 6 and 7 never trained)."""
    from nlptrain.loaders import RankShard

    class Counted(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(rows))

        def __len__(self) -> int:
            return rows

    shares = [list(RankShard(Counted(), world, rank)) for rank in range(world)]
    sampler = torch.utils.data.DistributedSampler(range(rows), world, 0, shuffle=False)
    expected = [list(torch.utils.data.DistributedSampler(range(rows), world, rank, shuffle=False))
                for rank in range(world)]
    assert shares == expected and len(sampler) == len(RankShard(Counted(), world, 0))


def test_a_counted_stream_read_by_one_dataloader_worker_is_made_up_as_without_one():
    """One worker holds the whole share: its length said the made-up count and the worker
    yielded one row fewer, an error on rank 1 and a timeout on rank 0 (review 123)."""
    from nlptrain.loaders import RankShard

    class Counted(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(7))

        def __len__(self) -> int:
            return 7

    share = RankShard(Counted(), 2, 1)
    read = list(DataLoader(share, batch_size=None, num_workers=1))
    assert [int(i) for i in read] == [1, 3, 5, 0] and len(share) == 4


class OverstatedStream(OwnStream):
    """48 rows that say they are 60."""

    def __len__(self) -> int:
        return 60


@pytest.mark.parametrize(("stream_class", "workers", "said"), [
    (OverstatedStream, 0, r"OverstatedStream yielded 6 batches on this rank, but its __len__ "
                          r"says 8 or more"),
    (OwnStream, 2, r"2 DataLoader workers each batch their own share of an IterableDataset, so "
                   r"its __len__ does not count the epoch's batches: set \[train\] steps_per_epoch")])
def test_an_iterable_datasets_len_counts_the_epoch_only_where_it_can(tmp_path, tiny_model_dir,
                                                                    stream_class, workers, said):
    """A __len__ that says more rows than come is one error (the rank ran dry while the others
    waited in a collective); with several workers, each batching its share, it counts no epoch."""
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]),
                      stream_class(str(tiny_model_dir)),
                      config=TrainConfig(epochs=1, batch_size=8, num_workers=workers), progress=False)
    with pytest.raises((ConfigError, DataError), match=said):
        trainer.fit()


def test_a_stream_without_a_length_under_several_workers_is_told_it_has_none():
    """The rank's RankShard has a __len__ whatever it wraps: the error blamed a __len__ the
    user's dataset never had."""
    from types import SimpleNamespace

    from nlptrain.loaders import epoch_batches, train_loader
    from nlptrain.progress import Progress

    class Unsized(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    config = TrainConfig(batch_size=2, num_workers=2)
    loader = train_loader(Unsized(), config, 2, 0, lambda rows: rows, torch.device("cpu"))
    rank0 = SimpleNamespace(is_main=True, world_size=2, rank=0, agree_min=lambda n: n)
    with pytest.raises(ConfigError, match=r"^the training data has no length: set \[train\] "
                                          r"steps_per_epoch$"):
        epoch_batches(loader, config, Progress(), rank0, 0)


def test_a_resume_its_checkpoint_refuses_leaves_the_runs_record_as_it_was(toy_task, tmp_path,
                                                                          capfd):
    """The refused settings (here 2 DataLoader workers for a stream read by 1) stayed in
    config.json, so the plain `--resume` that the refusal suggests was refused as well."""
    from nlptrain.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--streaming",
                 "--steps-per-epoch", "5", "--max-steps", "2", "--checkpoint-every", "2",
                 "--no-cache"]) == 0
    recorded = (run / "config.json").read_text()
    capfd.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "4",
                 "--num-workers", "2"]) == 1
    assert "a stream stopped mid-epoch resumes only as it was read, by 1 rank(s) x 1 DataLoader " \
           "worker(s) (this job: 1 x 2)" in capfd.readouterr().err
    assert (run / "config.json").read_text() == recorded
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "4", "--nproc",
                 "2"]) == 1  # every rank refuses alike: said once, not once a rank
    assert capfd.readouterr().err.count("a stream stopped mid-epoch resumes only as it was read") == 1
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "4"]) == 0
    assert json.loads((run / "config.json").read_text())["resumes"][-1]["world_size"] == 1
