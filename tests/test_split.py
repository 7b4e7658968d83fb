"""`nlptrain split`: per-rank files + manifest, every row once, seeded shuffle, flat memory."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_cli, write_toy_tsv
from log_capture import nlptrain_messages

from nlptrain.config import TaskConfig, file_spec
from nlptrain.data.readers import iter_rows
from nlptrain.data.split import MANIFEST, Manifest, split_rows, split_task
from nlptrain.data.tokenized import file_digest
from nlptrain.errors import ConfigError, DataError


def source_rows(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [tuple(line.split("\t")) for line in lines]


def part_rows(folder: Path, name: str) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (folder / name).read_text(encoding="utf-8").splitlines()]
    return [(r["text"], r["label"]) for r in rows]


def toy_task(data: Path, train: str, **data_keys) -> TaskConfig:
    task = TaskConfig(name="toy", data_dir=str(data))
    task.data.train = train
    for key, value in data_keys.items():
        setattr(task.data, key, value)
    return task


def test_cli_split_writes_every_row_once_shuffled(tmp_path):
    source = write_toy_tsv(tmp_path / "train.tsv", 101, seed=3)
    done = run_cli(["split", "train.tsv", "--world-size", "3", "--shuffle", "--seed", "7",
                    "--out", "parts"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "101 rows -> 3 files" in done.stdout
    folder = tmp_path / "parts"
    manifest = json.loads((folder / MANIFEST).read_text())
    names = [p["file"] for p in manifest["parts"]]
    assert names == ["part-00000-of-00003.jsonl", "part-00001-of-00003.jsonl",
                     "part-00002-of-00003.jsonl"]
    assert manifest["world_size"] == 3 and manifest["rows"] == 101
    assert [p["rows"] for p in manifest["parts"]] == [34, 34, 33]  # round-robin
    assert manifest["seed"] == 7 and manifest["shuffle"] is True
    assert manifest["source"]["checksum"] == file_digest([source])
    assert manifest["labels"] == ["neg", "pos"]
    written = [row for name in names for row in part_rows(folder, name)]
    assert Counter(written) == Counter(source_rows(source))  # every row exactly once
    dealt_in_order = [row for i in range(34) for name in names
                      for row in part_rows(folder, name)[i:i + 1]]
    assert dealt_in_order != source_rows(source)  # shuffled before dealing
    for info in manifest["parts"]:
        assert info["checksum"] == file_digest([folder / info["file"]])
        assert info["bytes"] == (folder / info["file"]).stat().st_size


def test_same_seed_same_files_and_by_size_balances(tmp_path):
    write_toy_tsv(tmp_path / "train.tsv", 300, seed=4)
    task = toy_task(tmp_path, "train.tsv")
    first = split_task(task, tmp_path / "a", 4, shuffle=True, seed=1)
    again = split_task(task, tmp_path / "b", 4, shuffle=True, seed=1)
    other = split_task(task, tmp_path / "c", 4, shuffle=True, seed=2)
    assert [p["checksum"] for p in first.parts] == [p["checksum"] for p in again.parts]
    assert [p["checksum"] for p in first.parts] != [p["checksum"] for p in other.parts]
    by_size = split_task(task, tmp_path / "d", 4, by="size")
    chars = [sum(len(t) for t, _ in part_rows(tmp_path / "d", p["file"])) for p in by_size.parts]
    longest = max(len(t) for t, _ in source_rows(tmp_path / "train.tsv"))
    assert max(chars) - min(chars) <= longest + 40  # within about one row of each other
    assert sum(by_size.rows) == 300 and Manifest.load(tmp_path / "d").rows == by_size.rows


def test_split_one_file_per_label_format(tmp_path):
    (tmp_path / "mr.pos").write_text("a fine film\nlovely\n\n", encoding="utf-8")
    (tmp_path / "mr.neg").write_text("dull\ntoo long\nbad acting\n", encoding="utf-8")
    task = toy_task(tmp_path, "mr.{label}", labels=["neg", "pos"])
    manifest = split_task(task, tmp_path / "parts", 2)
    written = [row for p in manifest.parts for row in part_rows(tmp_path / "parts", p["file"])]
    assert sorted(written) == sorted([("a fine film", "pos"), ("lovely", "pos"), ("dull", "neg"),
                                      ("too long", "neg"), ("bad acting", "neg")])
    assert manifest.rows == [3, 2] and len(manifest.source["files"]) == 2
    # 'bad acting' moved to the start of mr.pos: the same bytes back to back, another label.
    (tmp_path / "mr.neg").write_text("dull\ntoo long\n", encoding="utf-8")
    (tmp_path / "mr.pos").write_text("bad acting\na fine film\nlovely\n\n", encoding="utf-8")
    moved = split_task(task, tmp_path / "parts", 2, overwrite=True)
    assert moved.source["checksum"] != manifest.source["checksum"]
    assert moved.source["checksum"] == file_digest([tmp_path / "mr.neg", tmp_path / "mr.pos"])


def test_split_refuses_to_clobber_and_reports_bad_rows(tmp_path):
    write_toy_tsv(tmp_path / "train.tsv", 20)
    task = toy_task(tmp_path, "train.tsv")
    split_task(task, tmp_path / "parts", 2)
    with pytest.raises(ConfigError, match="--overwrite"):
        split_task(task, tmp_path / "parts", 2)
    assert split_task(task, tmp_path / "parts", 4, overwrite=True).world_size == 4
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a split folder"):
        split_task(task, tmp_path / "mine", 2, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    # Any manifest.json made a folder a split's, which --overwrite then removed whole.
    (tmp_path / "mine" / "manifest.json").write_text('{"name": "my dataset"}')
    with pytest.raises(ConfigError, match=r"mine: exists and is not a split folder \(its "
                                          r"manifest\.json is not a split's\)"):
        split_task(task, tmp_path / "mine", 2, overwrite=True)
    (tmp_path / "parts" / ".nlptrain_cache").mkdir()  # a run's over them: still a split's
    assert split_task(task, tmp_path / "parts", 2, overwrite=True).world_size == 2
    (tmp_path / "parts" / "notes.txt").write_text("keep me too")  # a split's, and more
    with pytest.raises(ConfigError, match=r"parts: exists and is not a split folder \(it holds "
                                          r"notes\.txt too\)"):
        split_task(task, tmp_path / "parts", 2, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").is_file() and (tmp_path / "parts" / "notes.txt").is_file()
    with pytest.raises(ConfigError, match="at least 1"):
        split_task(task, tmp_path / "zero", 0)
    (tmp_path / "bad.tsv").write_text("text\tlabel\nfine\tpos\n\tneg\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.tsv:3: the row has no text"):
        split_task(toy_task(tmp_path, "bad.tsv"), tmp_path / "bad", 2)
    assert not (tmp_path / "bad").exists()  # nothing half-written is left under the name
    (tmp_path / "two.tsv").write_text("text\tlabel\nfine\tpos\npoor\tneg\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"two\.tsv: holds 2 row\(s\), too few for 3 per-rank files"):
        split_task(toy_task(tmp_path, "two.tsv"), tmp_path / "three", 3)  # a rank would get none
    assert not (tmp_path / "three").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"a-file/parts: cannot be written .*choose another --out"):
        split_task(task, tmp_path / "a-file" / "parts", 2)  # its parent cannot be made


@pytest.mark.parametrize("shuffle", [False, True])
def test_split_memory_does_not_grow_with_the_input(tmp_path, shuffle):
    peaks = []
    for rows in (10_000, 40_000):
        source = write_toy_tsv(tmp_path / f"in{rows}.tsv", rows, seed=5)
        spec = toy_task(tmp_path, source.name)
        out = tmp_path / f"out{rows}-{shuffle}"
        out.mkdir()
        tracemalloc.start()
        split_rows(iter_rows(file_spec(spec, "train"), tmp_path), out, 2, shuffle=shuffle,
                   input_bytes=source.stat().st_size, bucket_bytes=128 << 10)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    # 4x the rows: the peak stays about a bucket (128 KB) plus buffers, nowhere near 4x.
    assert peaks[1] < 1.5 * peaks[0] + (1 << 20), peaks
    assert peaks[1] < 8 << 20, peaks


def test_split_a_task_file_from_the_cli(tmp_path, toy_task, capsys):
    from nlptrain.cli import main

    out = tmp_path / "parts"
    assert main(["split", "--task", str(toy_task), "--world-size", "2", "--by", "size",
                 "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "160 rows -> 2 files" in said and "(2 labels seen: neg, pos)" in said
    manifest = Manifest.load(out)
    assert manifest.by == "size" and sum(manifest.rows) == 160 and manifest.labels == ["neg", "pos"]
    assert main(["split", "--world-size", "2"]) == 1  # neither FILE nor --task: a clear error
    assert "give a FILE or --task" in capsys.readouterr().err


def test_split_of_a_file_with_a_shipped_tasks_settings_needs_no_data_dir(tmp_path, capsys,
                                                                         monkeypatch):
    """The FILE is what is read: 'task sst2 needs its data folder' asked for a folder unused."""
    from nlptrain.cli import main

    monkeypatch.delenv("NLPTRAIN_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\nfine\t1\nmeh\t0\n")
    assert main(["split", "mine.tsv", "--task", "sst2", "--world-size", "2", "--out", "parts"]) == 0
    assert sum(Manifest.load(tmp_path / "parts").rows) == 4, capsys.readouterr().err


def test_a_multi_label_file_split_as_single_label_trains_its_labels_not_their_combinations(
        tmp_path, capsys):
    """`split FILE` reads one label a row: the manifest then listed 'joy,fear' as a label, and
    a multi-label task on those files trained a class for each combination."""
    from nlptrain.cli import main
    from nlptrain.data.streaming import per_rank_labels

    (tmp_path / "tags.tsv").write_text("text\tlabel\na\tjoy\nb\tjoy,fear\nc\tfear,love\nd\tlove\n")
    assert main(["split", str(tmp_path / "tags.tsv"), "--world-size", "1", "--out",
                 str(tmp_path / "parts")]) == 0
    task = TaskConfig(name="tags", data_dir=str(tmp_path))
    task.data.kind, task.data.train_shards = "multi_label", "parts"
    assert per_rank_labels(task, None, 1).names == ["fear", "joy", "love"]
    # A row of none of the labels, read as single-label: the error says how to read it.
    (tmp_path / "empty.tsv").write_text("text\tlabel\na\tjoy\nb\t\n")
    assert main(["split", str(tmp_path / "empty.tsv"), "--world-size", "1", "--out",
                 str(tmp_path / "parts2")]) == 1
    assert "empty.tsv:3: the row has no label (read as single-label: a multi-label or regression " \
        "file needs --set data.kind=multi_label" in capsys.readouterr().err


def test_a_source_grouped_by_label_warns_unless_shuffled(tmp_path, capsys):
    """One file per label (a `lines` task), split in file order, made every rank train all of
    one class, then all of the other: the model learnt nothing, and nothing said so."""
    from nlptrain.cli import main

    for label in ("neg", "pos"):
        (tmp_path / f"mr.{label}").write_text("".join(f"{label} row {i}\n" for i in range(150)))
    task = toy_task(tmp_path, "mr.{label}", labels=["neg", "pos"], format="lines")
    warning = ("the rows come grouped by label in every part (part-00000-of-00002.jsonl: 1 label "
               "change in 150 rows; a shuffled order has ~75): read in file order, each rank "
               "trains class by class and learns little; give --shuffle (or train with "
               "--shard-shuffle)")
    with nlptrain_messages() as said:
        split_task(task, tmp_path / "grouped", 2)
        split_task(task, tmp_path / "shuffled", 2, shuffle=True)
        write_toy_tsv(tmp_path / "mixed.tsv", 300, seed=5)  # labels at random: in file order is fine
        split_task(toy_task(tmp_path, "mixed.tsv"), tmp_path / "mixed", 2)
    assert said == [f"{tmp_path / 'mr.neg'}, {tmp_path / 'mr.pos'}: {warning}"]
    assert main(["split", "--task", "rt-polarity", "--data-dir", str(tmp_path), "--set",
                 "data.train=mr.{label}", "--world-size", "2", "--out", str(tmp_path / "cli")]) == 0
    assert f"warning: {tmp_path / 'mr.neg'}, {tmp_path / 'mr.pos'}: {warning}" in \
        capsys.readouterr().err


def test_a_regression_files_bad_score_is_refused_by_split_at_its_source_line(tmp_path, capsys):
    """`split --set data.kind=regression` wrote a score that is no number into a part; training
    then failed on one rank, naming the part's line, not the source's."""
    from nlptrain.cli import main

    (tmp_path / "scores.tsv").write_text("text\tlabel\na\t0.5\nb\t3.8\nc\tn/a\nd\t1e400\n")
    args = ["split", str(tmp_path / "scores.tsv"), "--world-size", "2", "--set",
            "data.kind=regression", "--out"]
    assert main([*args, str(tmp_path / "parts")]) == 1
    assert "scores.tsv:4: score 'n/a' is not a number" in capsys.readouterr().err
    assert not (tmp_path / "parts").exists()  # nothing half-written is left
    (tmp_path / "scores.tsv").write_text("text\tlabel\na\t0.5\nb\t3.8\nd\t1e400\n")
    assert main([*args, str(tmp_path / "parts")]) == 1
    assert "scores.tsv:4: score '1e400' is beyond float32's range" in capsys.readouterr().err
    (tmp_path / "scores.tsv").write_text("text\tlabel\na\t0.5\nb\t3.8\n")
    assert main([*args, str(tmp_path / "parts")]) == 0



def test_a_label_the_task_does_not_name_is_refused_by_split_at_its_source_line(tmp_path, capsys):
    """A misspelt label was split without a word; the run then refused the manifest, naming no
    row of the source."""
    from nlptrain.cli import main

    (tmp_path / "l.tsv").write_text("text\tlabel\na\tpos\nb\tneg\nc\tpostive\nd\tneg\n")
    args = ["split", str(tmp_path / "l.tsv"), "--world-size", "2", "--set",
            "data.labels=['neg', 'pos']", "--out", str(tmp_path / "parts")]
    assert main(args) == 1
    assert "l.tsv:4: label 'postive' is not one of the task's labels" in capsys.readouterr().err
    assert not (tmp_path / "parts").exists()


def test_a_jsonl_files_lists_of_labels_split_without_a_task_are_kept_as_lists(tmp_path, capsys):
    """`split FILE` reads one label a row unless told the kind; a JSON list of labels is a
    multi-label row (a multi_label task trains on the parts), kept, not refused."""
    from nlptrain.cli import main
    from nlptrain.data.streaming import per_rank_labels

    (tmp_path / "tags.jsonl").write_text('{"text": "a", "label": ["joy", "fear"]}\n'
                                         '{"text": "b", "label": ["love"]}\n')
    assert main(["split", str(tmp_path / "tags.jsonl"), "--world-size", "1", "--out",
                 str(tmp_path / "parts")]) == 0
    assert "(3 labels seen: fear, joy, love)" in capsys.readouterr().out
    task = TaskConfig(name="tags", data_dir=str(tmp_path))
    task.data.kind, task.data.train_shards = "multi_label", "parts"
    assert per_rank_labels(task, None, 1).names == ["fear", "joy", "love"]
