"""Per-rank files on real processes (gloo): each row once per epoch, uneven files end cleanly and
say what they dropped or repeated, and a manifest for another world size is refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
from conftest import run_cli, write_toy_tsv
from ddp import run_ranks
from nlptrain.callbacks import PerRankData
from nlptrain.callbacks.per_rank_data import EpochSampler, plan

from nlptrain import Callback, DistTrainer, TaskConfig, TrainConfig
from nlptrain.data.split import Manifest, part_name, split_task
from nlptrain.errors import ConfigError
from nlptrain.models import load_model, load_tokenizer


class RecordRows(Callback):
    """The toy row number ("row N was ...") of every example trained on, per epoch."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.rows: dict[int, list[int]] = {}

    def on_batch_start(self, trainer, batch) -> None:
        texts = self.tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
        self.rows.setdefault(trainer.epoch, []).extend(int(t.split()[1]) for t in texts)


def write_parts(folder: Path, source: Path, sizes: list[int]) -> Path:
    """Per-rank files of the given sizes, in source order, with their manifest."""
    folder.mkdir(parents=True)
    rows = [line.split("\t") for line in source.read_text().splitlines()[1:]]
    parts, start = [], 0
    for rank, size in enumerate(sizes):
        name = part_name(rank, len(sizes))
        with open(folder / name, "w") as handle:
            for text, label in rows[start:start + size]:
                handle.write(json.dumps({"text": text, "label": label}) + "\n")
        parts.append({"file": name, "rows": size})
        start += size
    Manifest(len(sizes), parts, ["neg", "pos"]).save(folder)
    return folder


def fit(folder: Path, model_dir: str, epochs: int = 1, max_steps: int = 0,
        **options) -> tuple[PerRankData, RecordRows]:
    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(0)
    model = load_model(model_dir, ["neg", "pos"])
    data = PerRankData(folder, ["neg", "pos"], max_length=32, **options)
    record = RecordRows(tokenizer)
    config = TrainConfig(epochs=epochs, max_steps=max_steps, batch_size=8, lr=1e-3, timeout=60)
    trainer = DistTrainer(model, None, None, config=config, callbacks=[data, record],
                          tokenizer=tokenizer)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return data, record


def job(rank: int, world: int, folder: str, model_dir: str) -> dict:
    # One process group for several trainers: the trainers do not own it, so close() keeps it.
    torch_dist.init_process_group("gloo")
    out: dict = {}
    root = Path(folder)
    try:
        fit(root / "three", model_dir)
    except ConfigError as err:
        out["refused"] = str(err)
    data, record = fit(root / "even", model_dir, epochs=2, shuffle=True, seed=3)
    out["even"] = record.rows
    for policy in ("drop", "wrap"):
        data, record = fit(root / "uneven", model_dir, uneven=policy)
        out[policy] = {"rows": record.rows[0], "reports": data.reports}
    torch_dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_model_dir) -> list[dict]:
    root = tmp_path_factory.mktemp("per-rank")
    source = write_toy_tsv(root / "train.tsv", 237, seed=1)
    task = TaskConfig(name="toy", data_dir=str(root))
    task.data.train = "train.tsv"
    split_task(task, root / "three", 3)
    write_parts(root / "even", source, [40, 39])  # 5 batches of 8 each
    write_parts(root / "uneven", source, [100, 137])  # 13 and 18 batches
    return run_ranks(job, 2, root, str(root), str(tiny_model_dir))


def test_manifest_for_three_ranks_is_refused_on_two(results):
    for result in results:
        assert "made for 3 ranks, but this job runs 2" in result["refused"]
        assert "--world-size 2" in result["refused"]


def test_each_row_trained_once_per_epoch_across_ranks(results):
    for epoch in (0, 1):
        seen = [row for r in results for row in r["even"][epoch]]
        assert sorted(seen) == list(range(79))
    assert sorted(results[0]["even"][0]) == list(range(40))  # rank 0 reads only its own file
    assert results[0]["even"][0] != results[0]["even"][1]  # reshuffled with seed + epoch


def test_uneven_files_drop_the_surplus_and_say_so(results):
    # 100 vs 137 rows, batch 8: every rank takes 13 batches; rank 1 leaves its last 33 rows out.
    assert results[0]["drop"]["rows"] == list(range(100))
    assert results[1]["drop"]["rows"] == list(range(100, 204))
    report = results[0]["drop"]["reports"][0]
    assert report["batches"] == 13
    assert report["ranks"] == [
        {"rows": 100, "batches": 13, "trained": 100, "dropped": 0, "repeated": 0},
        {"rows": 137, "batches": 18, "trained": 104, "dropped": 33, "repeated": 0}]


def test_uneven_files_wrap_the_shorter_one(results):
    # Every rank runs to 137 positions (18 batches): rank 0 sees its first 37 rows twice.
    assert Counter(results[0]["wrap"]["rows"]) == Counter([*range(100), *range(37)])
    assert results[1]["wrap"]["rows"] == list(range(100, 237))
    ranks = results[1]["wrap"]["reports"][0]["ranks"]
    assert [(r["trained"], r["dropped"], r["repeated"]) for r in ranks] == [(100, 0, 37), (137, 0, 0)]


def test_cli_uneven_files_end_and_report(tmp_path, toy_task):
    source = write_toy_tsv(tmp_path / "train-all.tsv", 237, seed=1)
    write_parts(tmp_path / "parts", source, [100, 137])
    done = run_cli(["train", "--task", str(toy_task), "--train-shards", "parts", "--epochs", "1",
                    "--output-dir", "run"], cwd=tmp_path, nproc=2, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stderr
    assert "each rank takes 13 batches (uneven shards policy: drop)" in log
    assert "rank 1: part-00001-of-00002.jsonl: 137 rows, takes 104, dropped 33" in log
    assert "rank 1: dropping 5 of its 18 batches" in log  # the trainer's own per-rank warning
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["test"]["rows"] == 40
    # The train set is the files' 237 rows (it was left out of results, report and model card).
    assert results["data"]["train"] == {"rows": 237, "source": "parts (2 per-rank files)"}
    assert "| train | 237 | parts (2 per-rank files) |" in (tmp_path / "run" / "report.md").read_text()
    assert "task toy: train 237, test 40 rows" in log
    # Its model scored in one process: refused, as the per-rank files were made for 2 ranks
    # (eval reads none of them).
    scored = run_cli(["eval", "--model", "run/model", "--json"], cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(scored.stdout)["accuracy"] == results["test"]["accuracy"]


def test_the_epoch_plan_says_where_max_steps_ends_the_run_and_warnings_come_once(tmp_path, toy_task):
    source = write_toy_tsv(tmp_path / "train-all.tsv", 237, seed=1)
    write_parts(tmp_path / "parts", source, [100, 137])
    done = run_cli(["train", "--task", str(toy_task), "--train-shards", "parts", "--max-steps", "2",
                    "--valid-size", "0.1", "--output-dir", "run"], cwd=tmp_path, nproc=2, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each rank takes 13 batches (uneven shards policy: drop; max_steps 2 ends the run 2 " \
           "optimizer step(s) in)" in done.stderr
    assert done.stderr.count("no valid set; per-rank or streamed train data is not split") == 1


def test_a_bad_row_in_one_ranks_file_leaves_no_run_that_refuses_the_fixed_command(tmp_path,
                                                                                  toy_task):
    """Rank 1's file is read as training starts, after the run directory was made: the error
    names its file and line, and the run, which wrote nothing else, does not stay behind as one
    that the same command, once the row is fixed, would refuse ("already holds a run")."""
    source = write_toy_tsv(tmp_path / "train-all.tsv", 40, seed=1)
    part = write_parts(tmp_path / "parts", source, [20, 20]) / part_name(1, 2)
    good = part.read_text()
    part.write_text(good.replace(good.splitlines()[4], '{"text": "no label"}'))
    command = ["train", "--task", str(toy_task), "--train-shards", "parts", "--epochs", "1",
               "--output-dir", "run"]
    failed = run_cli(command, cwd=tmp_path, nproc=2, timeout=180)
    assert failed.returncode != 0
    assert f"{part}:5: no 'label' field (label)" in failed.stderr
    assert not (tmp_path / "run").exists()
    part.write_text(good)
    fixed = run_cli(command, cwd=tmp_path, nproc=2, timeout=180)
    assert fixed.returncode == 0, fixed.stderr[-3000:]


def test_sampler_and_plan():
    sampler = EpochSampler(5, shuffle=True, seed=1, length=12)
    sampler.set_epoch(0)
    first = list(sampler)
    assert len(first) == 12 and sorted(first[:5]) == list(range(5))  # a full pass, then more
    sampler.set_epoch(1)
    assert list(sampler) != first
    assert list(EpochSampler(3, length=7)) == [0, 1, 2, 0, 1, 2, 0]
    dropped = plan([10, 20], batches=2, batch_size=4, drop_last=True)
    assert [(r["trained"], r["dropped"]) for r in dropped] == [(8, 2), (8, 12)]


def test_the_report_says_what_set_each_ranks_batch_count(tmp_path, caplog):
    """Rows each rank leaves out are 'dropped' either by the uneven shards policy or because
    [train] steps_per_epoch cut the epoch short; the report names which."""
    from types import SimpleNamespace

    source = write_toy_tsv(tmp_path / "train-all.tsv", 237, seed=1)
    callback = PerRankData(write_parts(tmp_path / "parts", source, [100, 137]))
    callback.manifest = Manifest.load(tmp_path / "parts")
    for steps_per_epoch, batches, why in ((0, 13, "uneven shards policy: drop"),
                                          (3, 3, "steps_per_epoch 3")):
        trainer = SimpleNamespace(config=TrainConfig(batch_size=8, steps_per_epoch=steps_per_epoch),
                                  batches_per_epoch=batches, epoch=0, is_main=True)
        callback._reported, callback.reports = False, []
        with caplog.at_level("INFO", logger="nlptrain"):
            callback.on_batch_start(trainer, {})
        assert f"each rank takes {batches} batches ({why})" in caplog.text
    # In file order, steps_per_epoch trains the same first rows every epoch: warned, once.
    assert caplog.text.count("each epoch trains the same first rows of each file, and the rest "
                             "are never trained; give --shard-shuffle") == 1


def test_each_epoch_whose_plan_differs_is_said_also_where_max_steps_ends_it(tmp_path, caplog):
    """max_steps ending the run inside epoch 2 was never said: the plan was logged only where
    the ranks' numbers changed, and they do not."""
    from types import SimpleNamespace

    source = write_toy_tsv(tmp_path / "train-all.tsv", 237, seed=1)
    callback = PerRankData(write_parts(tmp_path / "parts", source, [100, 137]))
    callback.manifest = Manifest.load(tmp_path / "parts")
    config = TrainConfig(batch_size=8, max_steps=17, epochs=3)
    with caplog.at_level("INFO", logger="nlptrain"):
        for epoch, step in ((0, 0), (1, 13)):
            callback.on_epoch_start(SimpleNamespace(epoch=epoch))
            callback.on_batch_start(SimpleNamespace(config=config, batches_per_epoch=13,
                                                    epoch=epoch, global_step=step, is_main=True), {})
    said = [r.getMessage().splitlines()[0] for r in caplog.records]
    assert said == ["per-rank data, epoch 1: each rank takes 13 batches (uneven shards policy: drop)",
                    "per-rank data, epoch 2: each rank takes 13 batches (uneven shards policy: "
                    "drop; max_steps 17 ends the run 4 optimizer step(s) in)"]


def test_a_resume_mid_epoch_onto_files_split_again_is_refused(tmp_path, toy_task, capsys,
                                                             monkeypatch):
    """The resume skips the batches done of each rank's file; files split again since (shuffled,
    say) would have it skip rows never trained. The files the run began with resume."""
    from nlptrain.cli import main

    source = write_toy_tsv(tmp_path / "train-all.tsv", 80, seed=1)
    split = ["split", str(source), "--world-size", "1", "--out", str(tmp_path / "parts"),
             "--overwrite"]
    assert main(split) == 0
    train = ["train", "--task", str(toy_task), "--train-shards", str(tmp_path / "parts"),
             "--epochs", "1", "--output-dir", str(tmp_path / "run"), "--checkpoint-every", "2"]
    monkeypatch.setenv("AT_STEP", "3")
    scaffold = Path(__file__).parent / "scaffold_callbacks.py"
    assert main([*train, "--callback", f"{scaffold}:SecondCtrlCAtStep"]) == 130
    assert main([*split, "--shuffle"]) == 0
    capsys.readouterr()
    assert main([*train, "--resume"]) == 1
    assert "its files were split again since the checkpoint (their checksums differ from those " \
           "the run read): resuming mid-epoch would skip rows it never trained" in capsys.readouterr().err
    assert main(split) == 0  # the same split as at first: the same files
    assert main([*train, "--resume"]) == 0


def test_parts_split_without_the_tasks_pair_column_say_to_split_again(tmp_path):
    """The advice was to set text_pair_column in the task, which already set it."""
    from nlptrain.callbacks.per_rank_data import read_part

    from nlptrain.config import FileSpec
    from nlptrain.errors import DataError

    part = tmp_path / "part-00000-of-00002.jsonl"
    part.write_text(json.dumps({"text": "a", "label": "pos"}) + "\n")
    spec = FileSpec(path=str(part), format="jsonl", text_column="text",
                    text_pair_column="text_pair", label_column="label")
    with pytest.raises(DataError, match=r"part-00000-of-00002\.jsonl:1: .*make the per-rank "
                                        r"files again with split --task TASK"):
        read_part(spec)


def test_per_rank_files_named_from_the_working_folder_say_where_they_are_looked_for(
        tmp_path, monkeypatch):
    """./parts held the manifest, but train_shards is relative to the data folder: the advice
    was to run split again."""
    from nlptrain.data.split import Manifest
    from nlptrain.errors import DataError

    Manifest(1, [{"file": "part-0.jsonl", "rows": 1}], ["neg", "pos"]).save(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(DataError, match=rf"no manifest; \./{tmp_path.name} holds one, but "
                                        "train_shards is relative to the task's data folder"):
        Manifest.load(tmp_path.parent / "data" / tmp_path.name, typed=tmp_path.name)


def test_a_file_grouped_by_label_read_in_file_order_warns(tmp_path, tiny_model_dir):
    """Rows of one class, then of the other, trained in file order: each epoch is class by
    class and the model learns little; said at the start, unless the rows are shuffled."""
    from log_capture import nlptrain_messages

    source = write_toy_tsv(tmp_path / "mixed.tsv", 120, seed=2)
    header, *rows = source.read_text().splitlines()
    by_label = tmp_path / "by-label.tsv"
    by_label.write_text("\n".join([header, *sorted(rows, key=lambda r: r.split("\t")[1])]) + "\n")
    grouped, mixed = write_parts(tmp_path / "grouped", by_label, [120]), \
        write_parts(tmp_path / "mixed", source, [120])
    with nlptrain_messages() as said:
        for folder, shuffle in ((grouped, False), (grouped, True), (mixed, False)):
            fit(folder, str(tiny_model_dir), max_steps=1, shuffle=shuffle)  # said before step 1
    warned = [m for m in said if "grouped by label" in m]
    assert len(warned) == 1, said
    assert warned[0].startswith(f"{grouped / part_name(0, 1)}: the rows come grouped by label "
                                "(1 label change in 120 rows; a shuffled order has ~")
    assert warned[0].endswith("read in file order, each rank trains class by class and learns "
                              "little; give --shard-shuffle (or split again with --shuffle)")
