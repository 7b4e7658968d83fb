"""Files whose form a reader would take wrong, each refused or read with a word: a whole JSON
document for JSON Lines, a packed file, a number or half an emoji for a text, a negative column,
braces in a {label} path, a data row read as the header."""

from __future__ import annotations

import pytest
from file_reading import labelled_task, read
from log_capture import nlptrain_messages

from nlptrain.config import FileSpec
from nlptrain.data.readers import iter_rows, read_examples, read_texts
from nlptrain.errors import DataError


def test_a_label_path_whose_folder_holds_braces_is_read(tmp_path, tiny_model_dir):
    """str.format read every brace in the path: a folder 'runs{x}' was a KeyError traceback."""
    from transformers import AutoTokenizer

    from nlptrain.data import build_datasets

    (tmp_path / "a{x}").mkdir()
    for label in ("neg", "pos"):
        (tmp_path / "a{x}" / f"{label}.txt").write_text("".join(f"{label} {i}\n" for i in range(5)))
    task = labelled_task(tmp_path, [], train="a{x}/{label}.txt", labels=["neg", "pos"])
    sets = build_datasets(task, AutoTokenizer.from_pretrained(str(tiny_model_dir)), use_cache=False)
    assert len(sets.train) + len(sets.test) == 10
    with pytest.raises(DataError, match=r"a\{x\}/neg_\{split\}\.txt: data file not found"):
        list(iter_rows(FileSpec(path="a{x}/{label}_{split}.txt"), tmp_path, ["neg", "pos"]))


def test_an_empty_file_of_a_class_is_named_not_the_path_pattern(tmp_path, tiny_model_dir):
    """Review 99: the warning named 'rt-polarity.{label}', not the empty rt-polarity.neg."""
    from transformers import AutoTokenizer

    from nlptrain.data import build_datasets

    (tmp_path / "neg.txt").write_text("")
    (tmp_path / "pos.txt").write_text("".join(f"pos {i}\n" for i in range(5)))
    task = labelled_task(tmp_path, [], train="{label}.txt", labels=["neg", "pos"])
    with nlptrain_messages() as said:
        build_datasets(task, AutoTokenizer.from_pretrained(str(tiny_model_dir)), use_cache=False)
    assert any(m.startswith(f"{tmp_path / 'neg.txt'}: no train rows of class(es) 'neg'")
               for m in said), said


@pytest.mark.parametrize(("content", "says"), [
    ('[\n  {"text": "fine", "label": "pos"}\n]\n', r"a\.json:1: not valid JSON \(Expecting value\); one "
     r"object a line \(JSON Lines\) is read, and this file is a JSON array: convert it, e\.g\. jq "
     r"-c '\.\[\]' IN > OUT"),
    ('[{"text": "fine", "label": "pos"}]\n', r"a\.json:1: expected a JSON object per line; .* a JSON array"),
    ('{"text": "fine", "label": "pos"}\n["stray", "row"]\n', r"a\.json:2: expected a JSON object "
     r"per line$"),  # a line of JSON Lines, not a whole array
    ('{\n  "text": "fine",\n  "label": "pos"\n}\n', r"a\.json:1: not valid JSON .*; one object a "
     r"line \(JSON Lines\) is read, and this object spans lines: convert the file, e\.g\. jq -c \."),
])
def test_a_whole_json_document_says_that_json_lines_are_read(tmp_path, content, says):
    """A valid JSON array in a .json file was called 'not valid JSON (Expecting value)'."""
    with pytest.raises(DataError, match=says):
        read(tmp_path, "a.json", content)


def test_a_packed_file_says_so_not_that_its_bytes_are_not_utf8(tmp_path):
    """A .tsv.gz read with --data-format tsv was told 'byte 0x8b ... is not UTF-8; iconv'."""
    import gzip

    (tmp_path / "a.tsv.gz").write_bytes(gzip.compress(b"text\tlabel\nfine\tpos\n"))
    for spec in (FileSpec(path="a.tsv.gz", format="tsv"), FileSpec(path="a.tsv.gz")):
        with pytest.raises(DataError, match=r"a\.tsv\.gz: gzip-compressed, not a text file: unpack "
                                            r"it \(gunzip -k FILE\) and give the file it holds$"):
            read_examples(spec, tmp_path, [])
    (tmp_path / "b.tsv").write_text("BZh roadster: a great little car\tpos\n")  # text, not bzip2
    assert read_examples(FileSpec(path="b.tsv", header=False, text_column=0, label_column=1),
                         tmp_path, []).texts[0].startswith("BZh")
    (tmp_path / "in.txt").write_bytes(b"PK\x03\x04\x14\x00")  # (predict reads any suffix as lines)
    with pytest.raises(DataError, match=r"in\.txt: a zip archive \(as an \.xlsx workbook is\), not "
                                        r"a text file: save the sheet as \.csv or \.tsv"):
        read_texts(tmp_path / "in.txt")


def _written(path, text: str):
    path.write_text(text)
    return path


def test_a_number_for_a_text_is_refused_and_a_lone_surrogate_read_as_a_replacement(tmp_path):
    """A column of ids read as the text trained on '101'; a JSON escape of half an emoji
    ("\\ud83d", cut off) reached the tokenizer, whose TypeError named no file or line."""
    from log_capture import nlptrain_messages

    with pytest.raises(DataError, match=r"a\.jsonl:1: the text is 101 \(a number\), not a string: "
                                        r"is the column the right one\?"):
        read(tmp_path, "a.jsonl", '{"text": 101, "label": "pos"}\n')
    with nlptrain_messages() as said:
        found = read(tmp_path, "b.jsonl", '{"text": "fine", "label": "pos"}\n'
                     '{"text": "cut \\ud83d here", "label": "pos"}\n{"text": "\\ud83d\\ude00", '
                     '"label": "pos"}\n')
    assert found.texts == ["fine", "cut \ufffd here", "\U0001f600"]  # a whole pair is an emoji
    kept = read_texts(_written(tmp_path / "c.jsonl", '{"text": "ok", "meta": {"a": ["x\\ud83d"]}}\n'),
                      keep=["meta"]).kept  # (json.dumps of it failed after scoring)
    assert kept == [{"meta": {"a": ["x\ufffd"]}}]
    assert [m for m in said if "surrogate" in m] == [
        f"{tmp_path / 'b.jsonl'}:2: a lone UTF-16 surrogate escape (half an emoji?) read as U+FFFD "
        "(and any later ones in the file)"]


def test_a_data_row_read_as_the_header_is_refused_not_lost(tmp_path):
    from log_capture import nlptrain_messages

    """Columns by number and the default header = true: a file without a header lost its first
    row to the header, silently. Where the first row's label is one of the task's, it is data."""
    (tmp_path / "a.tsv").write_text("good film\tpos\nbad film\tneg\n")
    spec = FileSpec(path="a.tsv", text_column=0, label_column=1)
    with pytest.raises(DataError, match=r"a\.tsv:1: the header row holds the label 'pos': a data "
                                        r"row\? Give --no-header"):
        read_examples(spec, tmp_path, ["neg", "pos"])
    found = read_examples(FileSpec(path="a.tsv", text_column=0, label_column=1, header=False),
                          tmp_path, ["neg", "pos"])
    assert list(found.texts) == ["good film", "bad film"]
    (tmp_path / "b.tsv").write_text("sentence\tlabel\ngood film\tpos\n")  # a real header: read
    assert list(read_examples(FileSpec(path="b.tsv", text_column=0, label_column=1), tmp_path,
                              ["neg", "pos"]).texts) == ["good film"]
    # A multi-label row first ("14,18"): its cell is two labels, a data row all the same.
    (tmp_path / "c.tsv").write_text("scared but glad\t14,18\nok\t18\n")
    with pytest.raises(DataError, match=r"c\.tsv:1: the header row holds the label '14,18'"):
        read_examples(FileSpec(path="c.tsv", text_column=0, label_column=1), tmp_path, ["14", "18"])
    # No labels named (found in the rows): a score or a class id beside a text is data; else
    # the row read as the header is said (a header's cells may be classes: spam, "5 stars").
    (tmp_path / "d.tsv").write_text("a man sings\ta man plays\t3.5\nok\tfine\t1\n")
    with pytest.raises(DataError, match=r"d\.tsv:1: the header row holds the label '3\.5': a data"):
        read_examples(FileSpec(path="d.tsv", text_column=0, text_pair_column=1, label_column=2),
                      tmp_path, [])
    (tmp_path / "f.tsv").write_text("good film\t1\nbad film\t0\n")
    with pytest.raises(DataError, match=r"f\.tsv:1: the header row holds the label '1'"):
        read_examples(FileSpec(path="f.tsv", text_column=0, label_column=1), tmp_path, [])
    headers = {"e.tsv": "0\t1\ngood film\t1\n", "g.csv": ",0,1\n0,good film,1\n",  # pandas'
               "h.tsv": "text\tspam\ngood film\tspam\n", "i.tsv": "text\tstars\ngood\t5 stars\n"}
    for name, content in headers.items():
        (tmp_path / name).write_text(content)
        columns = (1, 2) if name.endswith("csv") else (0, 1)
        with nlptrain_messages() as said:
            found = read_examples(FileSpec(path=name, text_column=columns[0],
                                           label_column=columns[1]), tmp_path, [])
        assert found.texts == ["good film" if name != "i.tsv" else "good"], name
        assert any(f"{name}: line 1 read as the header row" in m for m in said), said


@pytest.mark.parametrize("name", ["a.tsv", "a.csv"])
def test_a_negative_column_index_is_refused_not_read_from_the_end(tmp_path, name):
    """text_column = -1 read the last column, the label, as the text: the model learnt its label."""
    with pytest.raises(DataError, match=r"a\.[ct]sv: text column -1: columns count from 0, the "
                                        r"first; set text_column in the task's \[data\]"):
        read(tmp_path, name, "fine film\tpos\n".replace("\t", "\t" if name.endswith("tsv") else ","),
             header=False, text_column=-1, label_column=1)


def test_a_quoted_cell_over_two_lines_of_an_unquoted_tsv_is_refused_where_only_texts_are_read(tmp_path):
    """Review 99: predict, reading only the text column, scored each line of the cell as a text
    of its own (41 predictions for 40 rows) where train refused the file; a row that is only
    short of the header, without quotes, is still read."""
    path = _written(tmp_path / "in.tsv", 'text\tlabel\nfine\tpos\n"line one\nline two"\tneg\n')
    with pytest.raises(DataError, match=r"in\.tsv:3: 1 column\(s\), but the header has 2; cells in "
                                        r"quotes\? .* give --quoted"):
        read_texts(path)
    assert read_texts(path, quoted=True).texts == ["fine", "line one\nline two"]
    short = "text\tlabel\nfine\tpos\nno label\nShe said \"no\"\n\"Jaws\" is a classic\nMy TV: 55\"\n"
    assert read_texts(_written(tmp_path / "short.tsv", short)).texts == \
        ["fine", "no label", 'She said "no"', '"Jaws" is a classic', 'My TV: 55"']  # (reviews 100-1)


def test_a_label_path_without_a_format_trains_and_its_export_says_lines(tmp_path, tiny_model_dir):
    """The export's record of the training file's format took `{label}.txt` by its suffix and
    refused it ("cannot tell the format from '.txt'") after the data was read: a run that failed."""
    import json

    from nlptrain.cli import main

    for label in ("neg", "pos"):
        (tmp_path / f"{label}.txt").write_text("".join(f"{label} row {i}\n" for i in range(12)))
    task = tmp_path / "lines.toml"
    task.write_text(f"""
name = "lines"
data_dir = "."
[data]
train = "{{label}}.txt"
labels = ["neg", "pos"]
test_size = 0.25
[model]
name = "{tiny_model_dir}"
max_length = 16
[train]
epochs = 1
batch_size = 8
""")
    assert main(["train", "--task", str(task), "--output-dir", str(tmp_path / "run")]) == 0
    exported = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert exported["nlptrain_columns"]["format"] == "lines"
