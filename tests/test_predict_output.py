"""predict's output rows: the kept input columns as given (named apart from the outputs), the
prediction, the text; one TSV line or JSON object a row."""

from __future__ import annotations

import io

import numpy as np
import pytest

from nlptrain.predict_output import rows_of, write_rows


def test_tsv_output_keeps_one_line_per_row() -> None:
    probs = np.array([[0.25, 0.75], [0.9, 0.1]])
    out = io.StringIO()
    write_rows(rows_of(["tab\there", "new\nline"], probs, ["neg", "pos"], True), out, "tsv",
               ["neg", "pos"], True)
    assert out.getvalue().splitlines() == [
        "row\tlabel\tprobability\tp_neg\tp_pos\ttext",
        "1\tpos\t0.750000\t0.250000\t0.750000\ttab here",
        "2\tneg\t0.900000\t0.900000\t0.100000\tnew line"]


def test_tsv_output_writes_the_inputs_kept_values_as_given() -> None:
    """Kept columns are for joining the output back: an id is not rounded to 6 decimals, a tiny
    number not written as 0, a JSON null not as "None"; the prediction's own numbers are."""
    from types import SimpleNamespace

    texts = SimpleNamespace(texts=["good", "bad"], pairs=None, lines=None,
                            kept=[{"id": 1234567.891, "ts": 1e-9, "score": 0.123456789, "ok": True,
                                   "meta": {"a": "x"}, "p_pos": 0.3},
                                  {"id": None, "ts": 2.5, "score": 1.0, "ok": False, "meta": {},
                                   "p_pos": 0.6}])
    out = io.StringIO()
    write_rows(rows_of(texts, np.array([[0.25, 0.75], [0.9, 0.1]]), ["neg", "pos"], True), out,
               "tsv", ["neg", "pos"], True)
    # A kept "score" (a regression's output name) or "p_pos" (--all-probs') is the input's,
    # named so, and not rounded.
    assert out.getvalue().splitlines() == [
        "row\tid\tts\tinput_score\tok\tmeta\tinput_p_pos\tlabel\tprobability\tp_neg\tp_pos\ttext",
        '1\t1234567.891\t1e-09\t0.123456789\ttrue\t{"a": "x"}\t0.3\tpos\t0.750000\t0.250000\t'
        '0.750000\tgood',
        "2\t\t2.5\t1.0\tfalse\t{}\t0.6\tneg\t0.900000\t0.900000\t0.100000\tbad"]
    # predict's own output scored again keeps score and input_score both: the first was
    # renamed onto the second, which it replaced without a word.
    again = SimpleNamespace(texts=["good"], pairs=None, lines=None,
                            kept=[{"score": 0.5, "input_score": "x", "input_input_score": 1}])
    row = next(rows_of(again, np.array([[0.25, 0.75]]), ["neg", "pos"], False))
    assert {k: v for k, v in row.items() if "score" in k} == {
        "input_input_input_score": 0.5, "input_score": "x", "input_input_score": 1}


def test_the_writer_records_that_its_stdout_closed_as_it_finds_out(tmp_path, monkeypatch):
    """predict --nproc | head: the launcher reads this record to end quietly with 141, even when
    the agent ends the writer before it exits (only the launcher's half was tested)."""
    import json

    from nlptrain.launch import STDOUT_CLOSED
    from nlptrain.predict_output import write_output

    class Closed:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            pass

    record = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(record))
    monkeypatch.setattr("sys.stdout", Closed())
    with pytest.raises(BrokenPipeError):
        write_output(iter([{"label": "pos"}]), None, "jsonl", ["neg", "pos"], False)
    said = json.loads(record.read_text())["message"]["message"]
    assert said.startswith(STDOUT_CLOSED), said


def test_kept_cells_of_any_parquet_type_are_written_as_json_holds_them() -> None:
    """A decimal, a date or a binary id made json.dumps raise after the whole input was scored;
    a NaN was written as NaN, which no strict JSON reader takes."""
    import datetime
    import decimal
    import json
    from types import SimpleNamespace

    kept = [{"id": decimal.Decimal("12345678901234567890.5"), "day": datetime.date(2024, 5, 1),
             "raw": b"a1", "weight": float("nan")}]
    texts = SimpleNamespace(texts=["good"], pairs=None, lines=None, kept=kept)
    for fmt in ("jsonl", "tsv"):
        out = io.StringIO()
        write_rows(rows_of(texts, np.array([[0.25, 0.75]]), ["neg", "pos"], False), out, fmt,
                   ["neg", "pos"], False)
        if fmt == "jsonl":
            row = json.loads(out.getvalue(), parse_constant=lambda c: pytest.fail(c))
            assert (row["id"], row["day"], row["raw"], row["weight"]) == (
                "12345678901234567890.5", "2024-05-01", "a1", None)
        else:
            assert out.getvalue().splitlines()[1].split("\t")[:6] == [
                "1", "12345678901234567890.5", "2024-05-01", "a1", "", "pos"]


def test_an_output_naming_a_descriptor_of_this_process_writes_to_it_as_it_is_open(tmp_path) -> None:
    """--output /dev/stdout under a pipe failed after scoring (its resolved name is no file),
    and under `>>` replaced the file, losing what it held."""
    import os

    from nlptrain.errors import ConfigError
    from nlptrain.predict_output import check_output, write_output

    rows = list(rows_of(["good"], np.array([[0.25, 0.75]]), ["neg", "pos"], False))
    read, write = os.pipe()
    write_output(iter(rows), f"/dev/fd/{write}", "tsv", ["neg", "pos"], False)
    os.close(write)
    assert os.read(read, 1000).decode().splitlines()[1] == "1\tpos\t0.750000\tgood"
    os.close(read)
    with open(tmp_path / "app.tsv", "a") as appended:
        appended.write("earlier\n")
        appended.flush()
        write_output(iter(rows), f"/proc/self/fd/{appended.fileno()}", "tsv", ["neg", "pos"], False)
        with pytest.raises(ConfigError, match=r"--output is the input file"):  # `>> INPUT`
            check_output(f"/proc/self/fd/{appended.fileno()}", str(tmp_path / "app.tsv"))
    assert (tmp_path / "app.tsv").read_text().splitlines()[0::2] == ["earlier", "1\tpos\t0.750000\tgood"]


def test_an_output_naming_a_descriptor_not_open_for_writing_is_refused_before_scoring(tmp_path) -> None:
    """--output /dev/fd/9 with no descriptor 9 (or one open only to read) scored the whole input,
    then failed to write it."""
    import os

    from nlptrain.errors import ConfigError
    from nlptrain.predict_output import check_output

    read, write = os.pipe()
    os.close(write)
    with pytest.raises(ConfigError, match=rf"/dev/fd/{write}: no descriptor {write} is open"):
        check_output(f"/dev/fd/{write}")
    with pytest.raises(ConfigError, match=rf"/dev/fd/{read}: descriptor {read} is open for reading only"):
        check_output(f"/dev/fd/{read}")
    os.close(read)


def test_predict_in_bf16_scores_each_row_as_the_runs_own_evaluation_did(toy_task, tmp_path, capsys,
                                                                         monkeypatch):
    """predict padded each batch to its longest row, 64 rows a batch; the run's evaluation padded
    to a multiple of 8 (or to max_length), eval_batch_size rows a batch: in bf16 another padded
    width rounds otherwise, and an AG News row's probabilities moved by 4e-3 (one prediction
    flipped). The export records how its evaluation made batches, and predict makes them so
    (the tiny model here happens to round alike either way: the batches are checked too)."""
    import json

    import nlptrain.evaluate as evaluate
    from nlptrain.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                 "--precision", "bf16", "--pad-to-multiple-of", "4", "--eval-batch-size", "8"]) == 0
    exported = json.loads((run / "model" / "config.json").read_text())
    record = {"batch_size": 8, "pad_to": None, "multiple": 4, "limit": 32}
    assert exported["nlptrain_eval_batches"] == record
    with np.load(run / "predictions.npz") as saved:
        expected = saved["outputs"]
    scoring, made = evaluate.predict, []

    def spied(model, dataset, dist, collate, batch_size, *args, **kwargs):
        made.append((batch_size, {int(collate([dataset[i]])["input_ids"].shape[1])
                                  for i in range(len(dataset))}))
        return scoring(model, dataset, dist, collate, batch_size, *args, **kwargs)

    monkeypatch.setattr(evaluate, "predict", spied)
    capsys.readouterr()
    assert main(["predict", "--model", str(run / "model"), "--input", str(tmp_path / "test.tsv"),
                 "--format", "jsonl", "--all-probs", "--precision", "bf16"]) == 0
    [(batch_size, widths)] = made
    assert batch_size == record["batch_size"]
    assert all(width % 4 == 0 for width in widths) and len(widths) > 1, widths
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    found = np.array([[row["probabilities"]["neg"], row["probabilities"]["pos"]] for row in rows])
    assert np.array_equal(found.astype(np.float32), expected)  # (JSON: every digit)


def test_the_eval_batches_record_is_plain_json_whatever_numbers_a_collate_holds():
    """A Collator of the user's made with numpy ints (pad_to=lengths.max()) failed the export's
    save_pretrained at the end of the run (int64 is not JSON)."""
    import json

    from nlptrain import TrainConfig
    from nlptrain.data import Collator
    from nlptrain.models import eval_batches_record

    record = eval_batches_record(Collator(0, pad_to=np.int64(32), limit=np.int64(40)), TrainConfig())
    assert json.loads(json.dumps(record)) == {"batch_size": 64, "pad_to": 32, "multiple": 1,
                                              "limit": 40}
    assert eval_batches_record(lambda rows: rows, TrainConfig(pad_to_multiple_of=4))["multiple"] == 4
