"""Readers: formats, CRLF/BOM/blank lines, columns, labels, and errors naming file and line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import SHARED_DATA, needs_shared_data
from file_reading import labelled_task, read

from nlptrain.config import FileSpec, file_spec
from nlptrain.data import LabelVocab, stratified_split
from nlptrain.data.readers import iter_rows, read_examples
from nlptrain.errors import DataError
from nlptrain.task_files import load_task


def test_tsv_with_crlf_bom_and_trailing_blank_lines(tmp_path):
    content = "\ufefftext\tlabel\r\nfine film\tpos\r\n\r\nawful \"plot\"\tneg\r\n\r\n\r\n"
    ex = read(tmp_path, "a.tsv", content)
    assert ex.texts == ["fine film", 'awful "plot"'] and ex.labels == ["pos", "neg"]
    assert ex.origin(1) == (str(tmp_path / "a.tsv"), 4)


def test_csv_with_quotes_and_columns_by_index_without_header(tmp_path):
    content = '3,"Title","Text with ""quotes"", and commas"\n1,"T2","second"\n'
    ex = read(tmp_path, "a.csv", content, header=False, text_column=2, label_column=0)
    assert ex.texts == ['Text with "quotes", and commas', "second"] and ex.labels == ["3", "1"]


def test_jsonl_and_named_columns(tmp_path):
    rows = [{"sentence": "nice", "y": 1}, {"sentence": "bad", "y": 0}]
    ex = read(tmp_path, "a.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n",
              text_column="sentence", label_column="y")
    assert ex.texts == ["nice", "bad"] and ex.labels == ["1", "0"]


def test_one_file_per_label(tmp_path):
    (tmp_path / "x.pos").write_text("good one\ngreat one\n")
    (tmp_path / "x.neg").write_text("bad one\n\n")
    ex = read_examples(FileSpec(path="x.{label}"), tmp_path, ["neg", "pos"])
    assert ex.labels == ["neg", "pos", "pos"] and ex.texts[0] == "bad one"


@pytest.mark.parametrize("values", [["neg", "pos"], []])
def test_lines_format_without_label_in_the_path_is_refused_up_front(tmp_path, values):
    (tmp_path / "all.txt").write_text("good one\nbad one\n")
    rows = iter_rows(FileSpec(path="all.txt", format="lines"), tmp_path, values)
    with pytest.raises(DataError, match=r"^all\.txt: format 'lines' reads one file per label and "
                                        r"needs \{label\} in the path"):
        next(rows)  # before any row is yielded under a label it does not have


@pytest.mark.parametrize(("content", "message"), [
    ("text\tlabel\nok\tpos\nno label here\n", r"a\.tsv:3: 1 column\(s\), expected at least 2"),
    ("text\tlabel\nok\tpos\nempty label\t \n", r"a\.tsv:3: the row has no label"),
    ("text\tlabel\n\tpos\n", r"a\.tsv:2: the row has no text"),
    ("sentence\tlabel\nok\tpos\n", r"a\.tsv:1: no text column 'text' in the header"),
    (b"text\tlabel\nok\tpos\ncaf\xe9\tneg\n", r"a\.tsv:3: byte 0xe9 at column 4 is not UTF-8"),
    ("", r"a\.tsv: data file holds no rows"),
    # A tab inside a text: the label column would read a piece of the text.
    ("text\tlabel\nok\tpos\nso\tso\tneg\n", r"a\.tsv:3: 3 columns, but the header has 2; a text "
                                             r"holding a tab\? Replace it by a space"),
    ("text\tlabel\n\n\n", r"a\.tsv: data file holds no rows"),
    ("text\tlabel\rhello\tpos\rbye\tneg\r", r"a\.tsv:1: a carriage return \(\\r\) inside the "
                                           r"line: the file's line ends are probably CR alone"),
    ("text\tlabel\tlabel\nhello\tpos\tneg\n", r"a\.tsv:1: the header names 2 columns 'label' "
                                             r"\(label\); rename all but one"),
    # Excel's "Unicode Text": UTF-16, whose latin1 conversion would read as garbage headers.
    ("text\tlabel\nok\tpos\n".encode("utf-16"), r"a\.tsv: UTF-16 \(it starts with UTF-16's "
                                                r"byte order mark.*iconv -f utf-16 -t utf-8"),
    (b"text\tlabel\n\x93ok\x94\tpos\n", r"a\.tsv:2: byte 0x93 .* iconv -f cp1252 -t utf-8"),
    # UTF-16 without its byte order mark is valid UTF-8, with a NUL after every ASCII letter.
    ("text\tlabel\nok\tpos\n".encode("utf-16-le"), r"a\.tsv:1: a NUL byte \(0x00\) at column "
                                                  r"2: a binary file, or UTF-16 without its byte"),
    ("text\tlabel\nok\tpos\nbad\0\tneg\n", r"a\.tsv:3: a NUL byte \(0x00\) at column 4"),
    # Cells a csv writer quoted, read as TSV's plain text: --quoted is the cure, said.
    ('text\tlabel\n"two\nlines"\tpos\n', r"a\.tsv:2: 1 column\(s\), expected at least 2 .*; "
                                           r"cells in quotes\? .* give --quoted"),
    ('text\tlabel\n"a\ttab"\tpos\n', r"a\.tsv:2: 3 columns, but the header has 2; cells in "
                                       r"quotes\? If the file quotes its cells"),
])
def test_bad_rows_name_file_and_line(tmp_path, content, message):
    with pytest.raises(DataError, match=message):
        read(tmp_path, "a.tsv", content)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.tsv: data file not found"):
        read_examples(FileSpec(path="nope.tsv"), tmp_path, [])
    (tmp_path / "dir.tsv").mkdir()
    with pytest.raises(DataError, match=r"dir\.tsv: a folder, not a data file; check the path or "
                                        r"--data-dir"):
        read_examples(FileSpec(path="dir.tsv"), tmp_path, [])


def test_a_file_named_from_the_working_folder_is_pointed_at(tmp_path, monkeypatch):
    """`--train-file mine.tsv` from the folder that holds it: the name is read in the task's data
    folder, and the error says where the file is and what to give."""
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "mine.tsv").write_text("text\tlabel\nok\tpos\n")
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(DataError, match=r"data/mine\.tsv: data file not found; check the path or "
                                        r"--data-dir; \./mine\.tsv is here, but .* give --data-dir \."):
        read_examples(FileSpec(path="mine.tsv"), tmp_path / "data", [])
    # A name with a folder too many, from the data folder itself: only the folder is wrong, so
    # no hint of --data-dir (it is given), though a file of that base name is here.
    with pytest.raises(DataError, match=r"here/sub/mine\.tsv: data file not found; check the path "
                                        r"or --data-dir$"):
        read_examples(FileSpec(path="sub/mine.tsv"), tmp_path / "here", [])


def test_unknown_label_names_the_row(tmp_path):
    ex = read(tmp_path, "a.tsv", "text\tlabel\nok\tpos\nhmm\tmaybe\n")
    with pytest.raises(DataError, match=r"a\.tsv:3: label 'maybe' is not one of the task's labels"):
        LabelVocab.from_config(["neg", "pos"]).encode(ex)


def test_a_label_the_train_file_lacks_is_said_as_such_where_the_task_names_none(tmp_path,
                                                                               tiny_model_dir):
    """Review 99: it was "not one of the task's labels ...; add it to [data] labels", where the
    task names none, and a class added there would have no train rows."""
    from transformers import AutoTokenizer

    from nlptrain.data import build_datasets

    task = labelled_task(tmp_path, [("a b", "pos"), ("c d", "neg")] * 5, test="test.tsv")
    (tmp_path / "test.tsv").write_text("text\tlabel\nc\tpos\nd\tneutral\n")
    with pytest.raises(DataError, match=r"test\.tsv:3: label 'neutral' is not in the train file "
                                        r"\(.*train\.tsv\), whose labels \['neg', 'pos'\] the task "
                                        r"takes, as it names none"):
        build_datasets(task, AutoTokenizer.from_pretrained(str(tiny_model_dir)), use_cache=False)
    # A list where one label belongs is still said as such (review 101: said as an unknown label).
    (tmp_path / "test.jsonl").write_text('{"text": "c", "label": ["pos", "neutral"]}\n')
    task.data.test = "test.jsonl"
    with pytest.raises(DataError, match=r"test\.jsonl:1: a list of labels \['pos', 'neutral'\], "
                                        "but the task is single_label"):
        build_datasets(task, AutoTokenizer.from_pretrained(str(tiny_model_dir)), use_cache=False)
    task.data.labels, task.data.test = ["neg", "pos"], "test.tsv"  # named: the task's labels
    with pytest.raises(DataError, match=r"test\.tsv:3: label 'neutral' is not one of the task's"):
        build_datasets(task, AutoTokenizer.from_pretrained(str(tiny_model_dir)), use_cache=False)


def test_label_vocab_from_table_and_inferred():
    vocab = LabelVocab.from_config({"1": "World", "2": "Sports"})
    assert vocab.values == ["1", "2"] and vocab.names == ["World", "Sports"]
    assert LabelVocab.infer(["10", "2", "1", "2"]).values == ["1", "2", "10"]  # numeric order
    # isdigit() is True for these, and int() reads none of them: they are names, in text order
    assert LabelVocab.infer(["--1", "1"]).values == ["--1", "1"]
    assert LabelVocab.infer(["\u2460", "2"]).values == ["2", "\u2460"]
    assert LabelVocab.infer(["-3", "-10", "2"]).values == ["-10", "-3", "2"]


def test_stratified_split_is_seeded_and_keeps_class_balance():
    labels = np.array([0] * 5331 + [1] * 5331)
    kept, held = stratified_split(labels, 0.1, 42)
    assert len(held) == 1067 and len(kept) == 9595
    assert abs(labels[held].sum() - 533.5) <= 1
    again = stratified_split(labels, 0.1, 42)[1]
    assert np.array_equal(held, again) and not set(kept) & set(held)


def test_a_split_too_small_for_its_classes_says_what_to_change():
    labels = np.array([0] * 7 + [1] * 7 + [2] * 6)  # 20 rows: 10% holds out 2, for 3 classes
    with pytest.raises(DataError, match=r"^train\.tsv: \[data\] valid_size = 0\.1 of 20 train rows "
                                        r"holds out 2 and keeps 18, but a stratified split needs a "
                                        r"row of each of the 3 classes on both sides; set "
                                        r"valid_size between 0\.15 and 0\.85 or give the task a "
                                        r"\[data\] valid file$"):
        stratified_split(labels, 0.1, 0, "train.tsv", "valid")
    kept, held = stratified_split(labels, 0.15, 0, "train.tsv", "valid")  # the suggested low end
    assert sorted(labels[held]) == [0, 1, 2] and len(kept) == 17
    pairs = np.array([0, 0, 1, 1])  # two rows a class: one way only, and it is said so
    with pytest.raises(DataError, match=r"on both sides; set test_size to 0\.5 or give"):
        stratified_split(pairs, 0.2, 0, "p.tsv", "test")
    assert sorted(pairs[stratified_split(pairs, 0.5, 0, "p.tsv", "test")[1]]) == [0, 1]
    scores = np.array([0.5, 1.5, 2.5, 3.5], dtype=np.float32)  # split at random: no classes
    with pytest.raises(DataError, match=r"^s\.tsv: \[data\] test_size = 0\.9 of 4 train row\(s\) "
                                        r"leaves none to train on"):
        stratified_split(scores, 0.9, 0, "s.tsv", "test")


@needs_shared_data
@pytest.mark.parametrize(("task", "counts", "labels"), [
    ("rt-polarity", {"train": 10662}, ["negative", "positive"]),
    ("sst2", {"train": 67349, "valid": 872, "test": 1821}, ["negative", "positive"]),
    ("trec", {"train": 5452, "test": 500}, ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]),
    ("ag-news", {"train": 10001, "test": 7600}, ["World", "Sports", "Business", "Sci/Tech"]),
])
def test_shipped_tasks_read_the_real_data(task, counts, labels):
    from conftest import REPO

    config = load_task(REPO / "tasks" / f"{task}.toml")
    vocab = LabelVocab.from_config(config.data.labels)
    assert vocab.names == labels
    for which, rows in counts.items():
        ex = read_examples(file_spec(config, which), SHARED_DATA, vocab.values)
        assert len(ex) == rows
        ids = vocab.encode(ex)
        assert set(ids.tolist()) == set(range(len(labels)))


def test_csv_quoted_cell_keeps_its_line_break_and_reports_the_rows_first_line(tmp_path):
    content = 'text,label\n"two\nlines",pos\n"one",\n'
    with pytest.raises(DataError, match=r"a\.csv:4: the row has no label"):
        read(tmp_path, "a.csv", content)
    ex = read(tmp_path, "b.csv", 'text,label\n"two\nlines",pos\n')
    assert ex.texts == ["two\nlines"] and ex.origin(0)[1] == 2


def test_csv_row_with_more_cells_than_the_header_is_refused_not_shifted(tmp_path):
    with pytest.raises(DataError, match=r"a\.csv:3: 3 columns, but the header has 2; a text "
                                        r"holding a separator\? Quote the cell"):
        read(tmp_path, "a.csv", 'text,label\n"fine, really",pos\nfine, really,pos\n')
    ex = read(tmp_path, "b.csv", "text,label\nfine,pos,\nok,neg, \n")  # empty extra cells: fine
    assert ex.texts == ["fine", "ok"] and ex.labels == ["pos", "neg"]
    ex = read(tmp_path, "c.csv", "3,t,x,y\n", header=False, text_column=1, label_column=0)
    assert ex.texts == ["t"]  # no header: nothing to count the cells against


@pytest.mark.parametrize("content", ["pos,good\nneg,bad\npos,great, fun\n",
                                     "pos,great, fun\nneg,bad\npos,good\n"])
def test_header_less_rows_that_differ_past_the_columns_read_are_said(tmp_path, caplog, content):
    """Without a header a text holding the separator was cut there, unsaid (the first row's too).
    Columns that only some rows have read the same (the raw STS-B test file), so it is said."""
    with caplog.at_level("WARNING", logger="nlptrain"):
        ex = read(tmp_path, "d.csv", content, header=False, text_column=1, label_column=0)
    cut = content.splitlines().index("pos,great, fun") + 1
    assert "great" in ex.texts and re.search(
        r"d\.csv: its rows differ in the cells past column 2, the last read: 2 row\(s\) have 0 "
        rf"\(the first at line \d\); 1 row\(s\) have 1 \(the first at line {cut}\)\. A text that "
        r"holds the separator is cut there \(quote such a cell", caplog.text), caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="nlptrain"):  # the same cells past them: nothing said
        read(tmp_path, "e.tsv", "pos\tgood\tx\npos\tgreat\ty\n", header=False, text_column=1,
             label_column=0)
    assert caplog.text == ""


@needs_shared_data
def test_the_raw_sts_benchmark_test_files_extra_source_columns_are_read():
    """284 of its 1,379 rows carry two source columns more (the data README): read, and said."""
    ex = read_examples(FileSpec(path="glue-stsb/sts-test.tsv", header=False, text_column=5,
                                text_pair_column=6, label_column=4), SHARED_DATA, [])
    assert len(ex) == 1379


def test_a_nan_label_is_a_missing_one_not_a_class_named_nan(tmp_path):
    """JSON's NaN (and Parquet's float NaN, as Spark and polars write a missing value) made a
    class 'nan', trained without a word."""
    with pytest.raises(DataError, match=r"n\.jsonl:2: the row has no label \(NaN: a missing value\)"):
        read(tmp_path, "n.jsonl", '{"text": "a", "label": 0.0}\n{"text": "b", "label": NaN}\n')


def test_a_quote_never_closed_names_the_line_it_opens(tmp_path):
    content = 'text,label\nfine,pos\n"unclosed,neg\nok,pos\nalso ok,neg\n'  # csv reads to the end
    with pytest.raises(DataError, match=r"a\.csv:3: a quoted cell that starts in this row is never "
                                        r"closed"):
        read(tmp_path, "a.csv", content)


@pytest.mark.parametrize(("record", "message"), [
    ({"text": ["a", "b"], "label": "pos"}, r"b\.jsonl:2: the text is a list \(\['a', 'b'\]\), not a string"),
    ({"text": {"x": 1}, "label": "neg"}, r"b\.jsonl:2: the text is a dict"),
    ({"text": "ho", "label": {"a": 1}}, r"b\.jsonl:2: the label is a dict .* not a label or a list"),
    ({"text": "ho", "label": [["pos"]]}, r"b\.jsonl:2: the label is a list"),
    ({"text": True, "label": "pos"}, r"b\.jsonl:2: the text is true \(a boolean\), not a string"),
])
def test_a_json_container_where_a_text_or_label_belongs_is_refused_not_stringified(tmp_path, record,
                                                                                   message):
    lines = [json.dumps({"text": "hi", "label": "pos"}), json.dumps(record)]
    with pytest.raises(DataError, match=message):
        read(tmp_path, "b.jsonl", "\n".join(lines) + "\n")


def test_boolean_labels_are_spelled_as_json_and_arrow_write_them(tmp_path):
    """JSON's true/false were read as Python's "True"/"False": a task listing its labels as the
    file spells them (labels = ["false", "true"]) refused every row."""
    rows = [{"text": "fine", "label": True}, {"text": "awful", "label": False},
            {"text": "both", "label": [True]}]
    ex = read(tmp_path, "b.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    assert ex.labels == ["true", "false", ["true"]]
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["fine", "awful"], "label": [True, False]}), tmp_path / "b.parquet")
    assert read(tmp_path, "b.parquet", (tmp_path / "b.parquet").read_bytes()).labels == ["true", "false"]
    # Labels listed as TOML booleans, as Python's "False"/"True" (a model trained before, a
    # pandas CSV) or as JSON's: the file's booleans match each, and keep the task's order.
    two = read(tmp_path, "c.jsonl", '{"text": "a", "label": true}\n{"text": "b", "label": false}\n')
    for labels in ([False, True], ["False", "True"], ["false", "true"], ["FALSE", "TRUE"]):
        assert LabelVocab.from_config(labels).encode(two).tolist() == [1, 0], labels
    assert LabelVocab.from_config([False, True]).names == ["false", "true"]
    assert LabelVocab.from_config(["true", "false"]).encode(
        read(tmp_path, "d.csv", "text,label\na,True\nb,False\n")).tolist() == [0, 1]


def test_an_unknown_format_of_one_file_is_refused_naming_it(tmp_path):
    with pytest.raises(DataError, match=r"p\.parquet: unknown format 'Parquet'; use one of "
                                         r"auto, csv, jsonl, lines, parquet, tsv"):
        read(tmp_path, "p.parquet", b"PAR1", format="Parquet")


def test_a_repeated_header_row_is_refused_not_read_as_a_class(tmp_path):
    """`cat train.tsv test.tsv > all.tsv` repeats the header: read as data, its 'label' cell
    would become a class of its own."""
    with pytest.raises(DataError, match=r"a\.tsv:4: the header row again \(files joined with "
                                        r"cat\?\)"):
        read(tmp_path, "a.tsv", "text\tlabel\nok\tpos\nbad\tneg\ntext\tlabel\nfine\tpos\n")
    export = "\ufefftext,label\r\nhello,pos\r\nbye,neg\r\n".encode()  # Excel's CSV UTF-8
    with pytest.raises(DataError, match=r"b\.csv:4: the header row again"):  # its BOM kept
        read(tmp_path, "b.csv", export + export)


def test_a_null_inside_a_label_list_is_refused_not_a_label_named_none(tmp_path):
    with pytest.raises(DataError, match=r"m\.jsonl:2: the label list holds a null"):
        read(tmp_path, "m.jsonl", '{"text": "a", "label": ["joy"]}\n'
                                  '{"text": "b", "label": ["joy", null]}\n')


def test_odd_classes_in_the_train_file_are_said_and_the_split_says_how_it_was_made(
        tmp_path, tiny_model_dir):
    """A typo ('postive', 1 row) makes a class of its own where the labels are read from the
    file: warned, and the held-out split it cannot stratify is called random, not stratified.
    A class the task names but the file lacks is warned too."""
    from log_capture import nlptrain_messages
    from transformers import AutoTokenizer

    from nlptrain.data import build_datasets

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = [(f"row {i}", "pos" if i % 2 else "neg") for i in range(40)] + [("great", "postive")]
    with nlptrain_messages() as said:
        sets = build_datasets(labelled_task(tmp_path, rows), tokenizer, use_cache=False)
    assert any("label(s) 'postive' (1 row) of 41 rows: typos?" in m for m in said), said
    assert sets.sources["test"] == "20% of train (at random, seed 42)"

    rows = [(f"row {i}", "pos" if i % 2 else "neg") for i in range(40)]
    with nlptrain_messages() as said:
        sets = build_datasets(labelled_task(tmp_path, rows, labels=["neg", "pos", "neutral"]),
                              tokenizer, use_cache=False)
    assert any("no train rows of class(es) 'neutral'" in m for m in said), said
    assert not any("typos?" in m for m in said)  # the task names its labels: none inferred
    assert sets.sources["test"] == "20% of train (stratified, seed 42)"


def test_a_cell_that_starts_with_a_quote_of_its_text_says_the_cure(tmp_path):
    """csv's own words were the message: "'\t' expected after '"'" (a TAB in it), no cure."""
    with pytest.raises(DataError, match=r"a\.tsv:3: a cell starts with a quote that is not CSV "
                                        r"quoting .*; give --no-quoted \(quoted = false"):
        read(tmp_path, "a.tsv", 'text\tlabel\nfine\tpos\n"Thanks" is all\tneg\n', quoted=True)
    with pytest.raises(DataError, match=r'b\.csv:3: a cell starts with a quote .*; quote the whole '
                                        r'cell, with "" for each quote inside'):
        read(tmp_path, "b.csv", 'text,label\nfine,pos\n"Thanks" is all,neg\n')


def test_a_quote_that_runs_into_the_next_row_names_the_line_it_opened_on(tmp_path):
    """Review 99: the next row's line was named, where csv gave up, not line 3's open quote."""
    with pytest.raises(DataError, match=r"c\.csv:3 \(its quoted cell read on into line 4\): a "
                                        r"cell starts with a quote"):
        read(tmp_path, "c.csv", 'text,label\nfine,pos\n"never closed,neg\n"next row",pos\n')


def test_too_few_columns_names_the_option_of_the_column_beyond_the_row(tmp_path):
    with pytest.raises(DataError, match=r"c\.tsv:1: 2 column\(s\), expected at least 4 \(text in "
                                        r"column 1, label in column 4\); set label_column in the "
                                        r"task's \[data\]"):
        read(tmp_path, "c.tsv", "a\tb\n", header=False, text_column=0, label_column=3)


def test_a_null_label_list_is_a_row_left_unlabelled_not_one_with_no_labels(tmp_path):
    """Multi-label: an empty list or cell lists none of the labels; null is a value left out
    (as in a single-label task), not a verdict of "none"."""
    path = tmp_path / "ml.jsonl"
    path.write_text('{"text": "fine", "labels": []}\n{"text": "unread", "labels": null}\n')
    spec = FileSpec(path=str(path), label_column="labels")
    rows = iter_rows(spec, tmp_path, ["joy"], empty_label_ok=True)
    assert next(rows).label == []
    with pytest.raises(DataError, match=r"ml\.jsonl:2: the row has no label \(null; an empty list"):
        next(rows)


@pytest.mark.parametrize("missing", ["valid", "test"])
def test_a_missing_valid_or_test_file_is_said_before_train_is_read(tmp_path, missing):
    """Review 99: a single process read and tokenized the whole train file (minutes, for a large
    one) before it found the dev file missing; `--nproc` checked before it started workers."""
    from nlptrain.data import build_datasets

    class NotToBeCalled:
        def __call__(self, *args, **kwargs):
            raise AssertionError("the train file was tokenized before the missing file was said")

    task = labelled_task(tmp_path, [("a b", "pos"), ("c d", "neg")] * 5)
    setattr(task.data, missing, f"{missing}.tsv")
    with pytest.raises(DataError, match=rf"{missing}\.tsv: {missing} file not found"):
        build_datasets(task, NotToBeCalled(), use_cache=False)
