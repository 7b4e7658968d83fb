"""`nlptrain predict`: one row per input text, in input order, with 1 or 2 processes alike."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from cpu_speed import pretend_cpu_speedups

from nlptrain.cli import build_parser, main
from nlptrain.data.readers import read_texts
from nlptrain.distributed import SingleProcess
from nlptrain.errors import ConfigError, DataError
from nlptrain.predict import default_max_length, run_predict
from nlptrain.predict_output import output_format


def varied_texts(count: int) -> list[str]:
    """Texts of very different lengths, so the length-sorted shards of each rank reorder them."""
    rng = random.Random(7)
    words = ["good", "bad", "film", "plot", "very", "quite", "awful", "lovely", "so", "the"]
    return [f"text {i} " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 25)))
            for i in range(count)]


def parse_tsv(text: str) -> list[dict[str, str]]:
    header, *lines = text.splitlines()
    return [dict(zip(header.split("\t"), line.split("\t"), strict=True)) for line in lines]


@pytest.fixture(scope="module")
def sharp_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A tiny BERT with large random weights: every text gets clearly its own probability (so a
    mix-up of rows would show) and both labels occur."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("sharp")
    config = BertConfig.from_pretrained(tiny_model_dir, initializer_range=0.5)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def test_order_and_probabilities_equal_with_1_and_2_processes(tmp_path: Path, sharp_model: Path,
                                                              monkeypatch) -> None:
    texts = varied_texts(37)  # odd: the two ranks score shares of different sizes
    (tmp_path / "in.tsv").write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in
                                                            enumerate(texts)))
    (tmp_path / "in.txt").write_text("\n".join(texts[:10]) + "\n\n" + "\n".join(texts[10:]) + "\n")
    common = ["predict", "--model", str(sharp_model), "--all-probs", "--batch-size", "4"]
    monkeypatch.chdir(tmp_path)
    assert main([*common, "--input", "in.tsv", "--output", "out.jsonl"]) == 0  # one process: this one
    # Plain text in (the blank line is skipped), TSV on stdout, written by rank 0 alone.
    two = run_cli([*common, "--input", "in.txt"], cwd=tmp_path, nproc=2)
    assert two.returncode == 0, two.stderr
    assert "in.txt: 37 texts, 2 process(es)" in two.stderr

    single = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    double = parse_tsv(two.stdout)
    assert list(double[0]) == ["row", "line", "label", "probability", "p_LABEL_0", "p_LABEL_1",
                               "text"]
    assert [r["text"] for r in single] == texts
    assert [r["text"] for r in double] == texts
    assert [r["row"] for r in single] == list(range(1, 38))
    assert [int(r["row"]) for r in double] == list(range(1, 38))
    # Where each text is in its input: after the TSV's header; past the text file's blank line.
    assert [r["line"] for r in single] == list(range(2, 39))
    assert [int(r["line"]) for r in double] == [*range(1, 11), *range(12, 39)]
    assert [r["label"] for r in single] == [r["label"] for r in double]
    names = ["LABEL_0", "LABEL_1"]
    probs_1 = np.array([[r["probabilities"][n] for n in names] for r in single])
    probs_2 = np.array([[float(r[f"p_{n}"]) for n in names] for r in double])
    np.testing.assert_allclose(probs_1, probs_2, atol=2e-6)
    np.testing.assert_allclose(probs_1.sum(axis=1), 1.0, atol=1e-5)
    assert [r["probability"] for r in single] == [max(p) for p in probs_1.tolist()]
    # The texts' probabilities really differ, so a permutation of rows would show.
    assert len({round(p, 4) for p in probs_1[:, 0]}) > 30
    assert {r["label"] for r in single} == set(names)


def predict_args(model: Path, input_file: Path):
    return build_parser().parse_args(["predict", "--model", str(model), "--input", str(input_file)])


def test_input_errors_name_the_file_and_the_fix(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in.csv").write_text("sentence,id\nhello,1\n")
    args = predict_args(tiny_model_dir, tmp_path / "in.csv")
    with pytest.raises(DataError, match=r"in.csv:1: no text column 'text' in the header \['sentence', "
                       r"'id'\]; name the text column with --text-column"):
        run_predict(args, SingleProcess())
    with pytest.raises(ConfigError, match=r"out.xlsx: cannot tell the output format from '.xlsx'"):
        output_format("out.xlsx", None)
    assert output_format("out.xlsx", "jsonl") == "jsonl"
    assert output_format(None, None) == "tsv"


def test_a_run_directory_or_a_model_without_tokenizer_is_a_clear_error(
        tmp_path: Path, sharp_model: Path) -> None:
    import shutil

    run = tmp_path / "run"  # a run directory: its config.json is the run's record
    shutil.copytree(sharp_model, run / "model")
    (run / "config.json").write_text(json.dumps({"task": {"name": "toy"}, "world_size": 1}))
    (tmp_path / "in.txt").write_text("hello\n")
    args = predict_args(run, tmp_path / "in.txt")
    with pytest.raises(ConfigError, match=r"run/config.json: not a model's config \(no model_type\);"
                       r" did you mean .*run/model\?"):
        run_predict(args, SingleProcess())
    weights_only = tmp_path / "weights-only"  # save_pretrained of the model alone
    shutil.copytree(sharp_model, weights_only, ignore=shutil.ignore_patterns("tokenizer*", "vocab*",
                                                                           "special_tokens*"))
    args.model = str(weights_only)
    with pytest.raises(ConfigError, match=r"weights-only: no usable tokenizer here"):
        run_predict(args, SingleProcess())


def test_a_pre_trained_encoder_without_a_classifier_head_is_refused_by_predict_and_eval(
        tmp_path: Path, tiny_model_dir: Path, toy_task: Path, capsys) -> None:
    """transformers would add a random head and score with it (labels LABEL_0, LABEL_1, new
    probabilities each time): such a folder is a model to fine-tune, not one to score with."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    encoder = tmp_path / "encoder"
    BertModel(BertConfig.from_pretrained(tiny_model_dir)).save_pretrained(encoder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(encoder)
    (tmp_path / "in.txt").write_text("hello\n")
    said = f"{encoder}: not a fine-tuned classifier: its weights lack classifier.bias, " \
           "classifier.weight, which would start at random"
    assert main(["predict", "--model", str(encoder), "--input", str(tmp_path / "in.txt")]) == 1
    assert said in capsys.readouterr().err
    assert main(["eval", "--model", str(encoder), "--task", str(toy_task)]) == 1
    assert said in capsys.readouterr().err


def test_read_texts_formats(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('label,text\nx,"hello, world"\ny,"say ""hi"""\n')
    assert read_texts(tmp_path / "a.csv").texts == ["hello, world", 'say "hi"']
    (tmp_path / "b.jsonl").write_text('{"review": "fine"}\n\n{"review": "tab\\there"}\n')
    assert read_texts(tmp_path / "b.jsonl", text_column="review").texts == ["fine", "tab\there"]
    (tmp_path / "c.txt").write_text("\ufeffone\r\ntwo\r\n\r\n")
    assert read_texts(tmp_path / "c.txt").texts == ["one", "two"]
    with pytest.raises(DataError, match=r"b.jsonl:1: no 'text' field \(text\); "
                       r"name the text column with --text-column"):
        read_texts(tmp_path / "b.jsonl")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError, match=r"empty.txt: input file holds no texts"):
        read_texts(tmp_path / "empty.txt")
    with pytest.raises(DataError, match=r"missing.tsv: input file not found; check --input$"):
        read_texts(tmp_path / "missing.tsv")
    with pytest.raises(DataError, match=r"missing.txt: input file not found; check --input$"):
        read_texts(tmp_path / "missing.txt")
    with pytest.raises(DataError, match=r": a folder, not an? input file; check --input$"):
        read_texts(tmp_path)


def test_a_max_length_beyond_the_models_positions_is_refused_before_scoring(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in.txt").write_text(" ".join(["word"] * 300) + "\n")  # 302 tokens; 128 positions
    args = predict_args(tiny_model_dir, tmp_path / "in.txt")
    args.max_length = 1000
    with pytest.raises(ConfigError, match=r"--max-length: max_length 1000 is more than the model's "
                       r"128 positions \(max_position_embeddings\); use at most 128"):
        run_predict(args, SingleProcess())


@pytest.mark.parametrize("option", [["--max-length", "-3"], ["--batch-size", "0"],
                                    ["--batch-size", "many"]])
def test_sizes_below_one_are_usage_errors(tmp_path: Path, capsys, option: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--model", "m", "--input", "in.txt", *option])
    assert exit_.value.code == 2
    assert f"argument {option[0]}: '{option[1]}' is not a whole number >= 1" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_is_refused_before_scoring(tmp_path: Path,
                                                                     tiny_model_dir: Path) -> None:
    (tmp_path / "in.txt").write_text("hello\n")
    args = predict_args(tiny_model_dir, tmp_path / "in.txt")
    args.output, args.format = str(tmp_path), "tsv"  # a folder
    with pytest.raises(ConfigError, match=r": --output is a folder; give a file, e\.g\. .*predictions"):
        run_predict(args, SingleProcess())
    args.output = str(tmp_path / "in.txt" / "out.tsv")  # under a file
    with pytest.raises(ConfigError, match=r"in.txt/out.tsv: cannot make its folder \(.+\)"):
        run_predict(args, SingleProcess())
    args.output = str(tmp_path / "." / "in.txt")  # the input, by another spelling
    with pytest.raises(ConfigError, match=r"--output is the input file; the predictions would "
                       r"replace its texts"):
        run_predict(args, SingleProcess())
    assert (tmp_path / "in.txt").read_text() == "hello\n"


def test_a_tab_inside_a_tsv_text_is_an_error_not_a_cut_text(tmp_path: Path) -> None:
    (tmp_path / "in.tsv").write_text("text\nfine\ngood\tstuff\n")  # would score "good" alone
    with pytest.raises(DataError, match=r"in.tsv:3: 2 columns, but the header has 1; a text "
                       r"holding a tab\?"):
        read_texts(tmp_path / "in.tsv")


def test_max_length_comes_from_the_run_else_from_the_model(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from transformers import RobertaConfig, RobertaForSequenceClassification

    tokenizer = SimpleNamespace(model_max_length=512)
    model_config = SimpleNamespace(max_position_embeddings=128)
    (tmp_path / "model").mkdir()
    assert default_max_length(tmp_path / "model", tokenizer, model_config) == 128
    # RoBERTa's kin number positions from pad_token_id + 1: 130 embeddings take 128 tokens.
    roberta = RobertaForSequenceClassification(RobertaConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=130, pad_token_id=1))
    assert default_max_length(tmp_path / "model", tokenizer, roberta) == 128
    (tmp_path / "config.json").write_text(json.dumps({"task": {"model": {"max_length": 48}}}))
    assert default_max_length(tmp_path / "model", tokenizer, model_config) == 48


@pytest.mark.distributed
def test_nproc_starts_its_own_workers_and_writes_what_one_process_does(tmp_path: Path,
                                                                       sharp_model: Path,
                                                                       capsys) -> None:
    texts = varied_texts(23)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    common = ["predict", "--model", str(sharp_model), "--input", "in.txt", "--all-probs"]
    two = run_cli([*common, "--nproc", "2", "--output", "two.tsv"], cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "in.txt: 23 texts, 2 process(es)" in two.stderr
    one = run_cli([*common, "--output", "one.tsv"], cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    rows_two, rows_one = (parse_tsv((tmp_path / name).read_text()) for name in ("two.tsv", "one.tsv"))
    assert [r["text"] for r in rows_two] == texts
    assert [r["label"] for r in rows_two] == [r["label"] for r in rows_one]
    np.testing.assert_allclose([float(r["p_LABEL_1"]) for r in rows_two],
                               [float(r["p_LABEL_1"]) for r in rows_one], atol=2e-6)
    # A missing input is one error before any worker starts, not one from each.
    missing = run_cli([*common, "--nproc", "2", "--input", "nope.txt"], cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.count("input file not found") == 1


def test_a_long_scoring_says_how_far_it_is(tmp_path: Path, sharp_model: Path, monkeypatch,
                                           capsys) -> None:
    """Predict on a big file (or eval of a big set) logs its progress every PROGRESS_EVERY_S
    seconds: here every batch, with the interval at 0."""
    import nlptrain.evaluate

    monkeypatch.setattr(nlptrain.evaluate, "PROGRESS_EVERY_S", 0.0)
    (tmp_path / "in.txt").write_text("\n".join(varied_texts(10)) + "\n")
    assert main(["predict", "--model", str(sharp_model), "--input", str(tmp_path / "in.txt"),
                 "--batch-size", "4", "--output", str(tmp_path / "out.tsv")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("scoring:")]
    assert [s.split(" (")[0] for s in said] == ["scoring: batch 1/3", "scoring: batch 2/3",
                                                "scoring: batch 3/3"]
    assert said[-1].endswith("(100%), about 0 s left")


def test_kept_columns_come_back_beside_each_prediction(tmp_path: Path, tiny_model_dir: Path,
                                                       monkeypatch, capsys) -> None:
    """--keep-columns: the input's id (to join the output back) and its gold label, which the
    output's own label column would hide: written as input_label."""
    monkeypatch.chdir(tmp_path)
    Path("in.tsv").write_text("id\ttext\tlabel\nA7\tgreat film\tpos\n\nB9\tawful\tneg\n")
    common = ["predict", "--model", str(tiny_model_dir), "--keep-columns", "id,label"]
    assert main([*common, "--input", "in.tsv"]) == 0
    rows = parse_tsv(capsys.readouterr().out)
    assert list(rows[0])[:4] == ["row", "line", "id", "input_label"]
    assert [(r["id"], r["input_label"], r["line"], r["text"]) for r in rows] == [
        ("A7", "pos", "2", "great film"), ("B9", "neg", "4", "awful")]
    assert all(r["label"] in ("LABEL_0", "LABEL_1") for r in rows)  # the prediction stays
    # JSON keeps the value's type: an id number stays a number.
    Path("in.jsonl").write_text('{"id": 7, "text": "great film"}\n{"id": 9, "text": "awful"}\n')
    assert main([*common[:-1], "id", "--input", "in.jsonl", "--format", "jsonl"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [7, 9]


def test_a_parquet_input_without_its_suffix_is_read_when_the_format_is_named(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch, capsys) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"id": ["A7", "B9"], "text": ["great film", "awful"]}), "export.bin")
    assert main(["predict", "--model", str(tiny_model_dir), "--input", "export.bin",
                 "--input-format", "parquet", "--keep-columns", "id"]) == 0
    assert [(r["id"], r["text"]) for r in parse_tsv(capsys.readouterr().out)] == [
        ("A7", "great film"), ("B9", "awful")]


def test_an_ndjson_input_is_read_as_json_lines(tmp_path: Path, tiny_model_dir: Path, monkeypatch,
                                               capsys) -> None:
    """.ndjson is JSON lines by another name: read as such, not scored as raw JSON text."""
    monkeypatch.chdir(tmp_path)
    Path("in.ndjson").write_text('{"text": "great film", "id": 7}\n{"text": "awful", "id": 8}\n')
    assert main(["predict", "--model", str(tiny_model_dir), "--input", "in.ndjson"]) == 0
    assert [r["text"] for r in parse_tsv(capsys.readouterr().out)] == ["great film", "awful"]


@pytest.mark.parametrize(("content", "fmt", "other"), [
    ('{"text": "great film", "id": 7}\n', "tsv", "jsonl"),  # one cell
    ('{"text": "great film", "id": 7}\n', "csv", "jsonl"),  # split at the JSON's comma
    ("text,id\ngreat film,7\n", "tsv", "csv"),
])
def test_an_input_read_in_another_format_names_predicts_own_option(
        tmp_path: Path, tiny_model_dir: Path, capsys, content, fmt, other) -> None:
    """predict has no --set: its hint was the task's '--set data.<...>.format=...'."""
    (tmp_path / "in.txt").write_text(content)
    assert main(["predict", "--model", str(tiny_model_dir), "--input", str(tmp_path / "in.txt"),
                 "--input-format", fmt]) == 1
    err = capsys.readouterr().err
    assert f"is the file {other}? Give --input-format {other}; or name the text column" in err, err
    assert "--set" not in err


@pytest.mark.parametrize("content, name, says", [
    ("id\ttext\nA7\tgreat\n", "in.tsv", r"in\.tsv:1: no kept column 'idx' in the header "
                                        r"\['id', 'text'\]; check --keep-columns"),
    ('{"id": 7, "text": "great"}\n', "in.jsonl", r"in\.jsonl:1: no 'idx' field \(kept\); check "
                                                  r"--keep-columns"),
    ("great\nawful\n", "in.txt", r"in\.txt: --keep-columns needs columns; give a \.tsv, \.csv"),
])
def test_a_column_to_keep_that_is_not_there_is_named(tmp_path: Path, content: str, name: str,
                                                     says: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=says):
        read_texts(tmp_path / name, keep=["idx"])


def test_a_header_less_quoted_file_is_read_as_the_run_read_its_training_file(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch, capsys) -> None:
    """A model trained on a TSV without a header row, its cells CSV-quoted (CoLA, GoEmotions):
    predict reads its input the same way unless told otherwise (else row 1 is lost as a header
    and the quotes stay in the texts), and scores in the run's precision."""
    import shutil

    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config.update(nlptrain_columns={"text": 1, "text_pair": "", "header": False, "quoted": True},
                  nlptrain_precision="bf16")
    (model / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    Path("in.tsv").write_text('a1\t"great, ""really"" great"\nb2\tawful\n')
    pretend_cpu_speedups(monkeypatch, bf16=2.0)  # a CPU that runs bf16 well
    assert main(["predict", "--model", "model", "--input", "in.tsv", "--keep-columns", "0",
                 "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["line"], r["0"], r["text"]) for r in rows] == [(1, "a1", 'great, "really" great'),
                                                            (2, "b2", "awful")]
    assert "in.tsv: read without a header row, as the model's training file was" in err
    assert "precision auto: bf16 (the model was trained and tested in it)" in err
    Path("in.jsonl").write_text('{"id": 7, "text": "fine"}\n')  # no header to speak of: not said
    assert main(["predict", "--model", "model", "--input", "in.jsonl", "--text-column", "text"]) == 0
    assert "without a header row" not in capsys.readouterr().err
    # Named fields: the training file's column 1 was this file's second field (an id: scored).
    assert main(["predict", "--model", "model", "--input", "in.jsonl", "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["text"] == "fine" and "in.jsonl: text column 'text', not the " \
        "training file's column 1" in err
    config["nlptrain_columns"]["header"] = True  # a Parquet's numbers (named columns) carry over
    (model / "config.json").write_text(json.dumps(config))
    assert main(["predict", "--model", "model", "--input", "in.jsonl"]) == 1
    assert "in.jsonl:1: no '1' field (text)" in capsys.readouterr().err
    # Each given option wins over the run's: a header row, its column by name, unquoted cells.
    Path("named.tsv").write_text('id\tsentence\nc3\t"as is"\n')
    assert main(["predict", "--model", "model", "--input", "named.tsv", "--header", "--no-quoted",
                 "--text-column", "sentence", "--precision", "fp32", "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    assert [(r["line"], r["text"]) for r in map(json.loads, out.splitlines())] == [(2, '"as is"')]
    assert "precision auto" not in err and "without a header row" not in err
    # A model whose training file had a header, a column given by number: row 1 goes as the
    # header, said (a header-less file lost its first text without a word).
    config["nlptrain_columns"].update(header=True, text="text")
    (model / "config.json").write_text(json.dumps(config))
    assert main(["predict", "--model", "model", "--input", "in.tsv", "--text-column", "1",
                 "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["line"] for line in out.splitlines()] == [2]
    assert "in.tsv: its first row is read as a header row, not predicted, as the model's training " \
           "file had one (--no-header if it has none)" in err


@pytest.mark.parametrize("name, content, pair, says, not_says", [
    ("in.txt", "a\tb\n", "b", r"pairs need columns; .* \(a file of tab-separated columns: "
                              r"--input-format tsv\)", None),
    ("in.jsonl", '{"text": "a"}\n', "hypothesis", r"in\.jsonl:1: no 'hypothesis' field \(pair\); "
                                                  r"name the text_pair column", "lines"),
    ("in.tsv", "sentence\na\n", "", r"no text column 'text' in the header \['sentence'\]; name "
     r"the text column with --text-column \(a file without a header row: --no-header and its "
     r"0-based index; one text a line: --input-format lines\)", None),
    ("in.csv", "3,Fears for pension,Unions say\n", "", r"in the header \['3', 'Fears for pension', "
     r"'Unions say'\]; .*--no-header and its 0-based index", None),
])
def test_an_input_error_suggests_what_fits_the_file(tmp_path: Path, name: str, content: str,
                                                   pair: str, says: str, not_says: str | None):
    """Each hint fits its file: a .txt of columns may be read as TSV, and a file of lines is no
    fix for a JSON object without its pair's field."""
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=says) as raised:
        read_texts(tmp_path / name, text_pair_column=pair)
    assert not_says is None or not_says not in str(raised.value)
