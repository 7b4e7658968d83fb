"""Task options on the command line: `--lr`-style flags and `--set section.key=value`, each
reaching the key it names, typed as people type them, and never two for one key."""

from __future__ import annotations

import re

import pytest

from nlptrain.cli import build_parser, resolve_task
from nlptrain.config import file_spec
from nlptrain.errors import ConfigError


def test_an_override_reaches_one_files_own_table(toy_task):
    args = build_parser().parse_args(["train", "--task", str(toy_task), "--set",
                                      "data.test.header=false", "--set", "data.valid.path=v.tsv"])
    task = resolve_task(args)
    assert (file_spec(task, "test").path, file_spec(task, "test").header) == ("test.tsv", False)
    assert file_spec(task, "train").header and file_spec(task, "valid").path == "v.tsv"


@pytest.mark.parametrize("typed", ["1,3", "1, 3", "[1, 3]"])
def test_a_list_option_takes_the_commas_people_type(toy_task, typed):
    task = resolve_task(build_parser().parse_args(["train", "--task", str(toy_task),
                                                   "--class-weights", typed]))
    assert task.train.class_weights == [1, 3]
    named = resolve_task(build_parser().parse_args(["train", "--task", str(toy_task),
                                                    "--text-column", "a,b"]))
    assert file_spec(named, "train").text_column == "a,b"  # no list of numbers: left as typed


@pytest.mark.parametrize("flags", [["--lr", "1e-4", "--set", "train.lr=3e-4"],
                                   ["--set", "train.lr=3e-4", "--lr", "1e-4"]])
def test_a_flag_and_a_set_for_the_same_key_are_refused_not_one_silently_lost(toy_task, flags):
    args = build_parser().parse_args(["train", "--task", str(toy_task), *flags])
    with pytest.raises(ConfigError, match=r"^--lr and --set train\.lr=3e-4 both set \[train\] lr; "
                       r"give one$"):
        resolve_task(args)


def test_the_start_up_log_line_says_the_main_settings_and_every_other_changed_one(toy_task):
    from nlptrain.recipe import settings_line

    task = resolve_task(build_parser().parse_args(["train", "--task", str(toy_task), "--lr", "3e-5",
                                                   "--eval-every", "5", "--batch-size", "4"]))
    line = settings_line(task)
    assert line.startswith(f"epochs {task.train.epochs}, lr 3e-05, scheduler linear, "
                           "warmup_ratio 0.1, weight_decay 0.01, max_grad_norm 1, seed 42, "
                           "max_length 32; also "), line
    assert "eval_every 5" in line and "batch_size" not in line  # the batch has its own line


def test_a_file_flag_naming_a_file_here_reads_it_from_here(toy_task, tmp_path, monkeypatch):
    """`--test-file ./mine.tsv` typed in a shell means the file there, not data/mine.tsv; a name
    that is no file here stays in the data folder, as the task file's paths do."""
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "mine.tsv").write_text("text\tlabel\nok\tpos\n")
    monkeypatch.chdir(tmp_path / "here")
    task = resolve_task(build_parser().parse_args(["train", "--task", str(toy_task), "--test-file",
                                                   "./mine.tsv", "--valid-file", "valid.tsv"]))
    assert file_spec(task, "test").path == str(tmp_path / "here" / "mine.tsv")
    assert file_spec(task, "valid").path == "valid.tsv"  # read in the data folder


def test_a_file_flag_replacing_a_tasks_table_says_how_to_keep_it(toy_task, tmp_path, capsys):
    """ag-news' test file is a table (no header, columns by number): --test-file naming the very
    file it names read it by [data]'s keys and failed with 'no text column', with no word why.
    The note comes from `train` itself: it logged nothing before its logging started."""
    from nlptrain.cli import main

    toy_task.write_text(toy_task.read_text().replace(
        'test = "test.tsv"', 'test = { path = "test.tsv", header = false, text_column = 2 }'))
    code = main(["train", "--task", str(toy_task), "--test-file", "nope.tsv", "--output-dir",
                 str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and "nope.tsv: test file not found" in err, err
    assert "--test-file nope.tsv replaces the task's [data] test table (header = false, text_column " \
           "= 2): it is read by [data]'s header and columns; --set data.test.path=nope.tsv reads " \
           "it by the table's" in err, err
    kept = resolve_task(build_parser().parse_args(["train", "--task", str(toy_task), "--set",
                                                   "data.test.path=other.tsv"]))
    spec = file_spec(kept, "test")
    assert (spec.path, spec.header, spec.text_column) == ("other.tsv", False, 2)


def test_a_task_file_without_a_name_is_named_after_the_file(toy_task):
    """runs/<task>-<time>: a file without `name =` gives its stem, not "task" for every such file."""
    nameless = toy_task.with_name("reviews-2026.toml")
    nameless.write_text(toy_task.read_text().replace('name = "toy"', ""))
    assert resolve_task(build_parser().parse_args(["train", "--task", str(nameless)])).name == "reviews-2026"
    assert resolve_task(build_parser().parse_args(["train", "--task", str(toy_task)])).name == "toy"


def test_a_task_built_in_python_is_checked_as_a_task_file_is(tmp_path) -> None:
    """recipe.train took a TaskConfig made in Python unchecked: a misspelt kind was a KeyError,
    a label named twice failed at the end of the run, in the plots."""
    from nlptrain import recipe
    from nlptrain.config import DataConfig, TaskConfig
    from nlptrain.distributed import SingleProcess

    for data, message in ((DataConfig(kind="multilabel"), "kind"),
                          (DataConfig(labels=["neg", "pos", "pos"]), "'pos' named more than once")):
        task = TaskConfig(name="mine", data=data)
        with pytest.raises(ConfigError, match=f"^task mine: .*{message}"):
            recipe.train(task, recipe.RunOptions(output_dir=str(tmp_path / "run")), SingleProcess())
        assert not (tmp_path / "run").exists()


def test_a_model_folder_given_relative_is_recorded_where_it_is(toy_task, tiny_model_dir, tmp_path,
                                                               monkeypatch):
    """config.json kept "tiny" as typed: a resume from any other folder found no model. A task
    file's relative model is read beside the file when it is not where the user stands, as its
    data_dir is."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    monkeypatch.chdir(tmp_path / "models")
    typed = resolve_task(build_parser().parse_args(["train", "--task", str(toy_task), "--model", "tiny"]))
    assert typed.model.name == str(tmp_path / "models" / "tiny")
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    shutil.copytree(tiny_model_dir, project / "models" / "mine")
    task = project / "mine.toml"
    task.write_text(toy_task.read_text().replace(str(tiny_model_dir), "models/mine"))
    monkeypatch.chdir(tmp_path)
    assert resolve_task(build_parser().parse_args(["train", "--task", str(task)])).model.name == \
        str(project / "models" / "mine")
    assert resolve_task(build_parser().parse_args(["train", "--task", str(task), "--model", "minilm"])
                        ).model.name == "minilm"  # a short name stays one


@pytest.mark.parametrize(("given", "message"), [
    (["--set", 'name="a/b"'], r"name = 'a/b' names the run's folder \(runs/<name>-<time>\): give "
                              r"a name without /"),
    (["--epochs", "1", "--set", "name=a/b"], r"^--set name=a/b: name = 'a/b'"),  # not --epochs too
    (["--set", 'name=".."'], r"name = '\.\.' names the run's folder"),
    (["--lr", "nan"], r"^--lr: \[train\] lr = nan; give a finite number$"),
    (["--max-grad-norm", "inf"], r"^--max-grad-norm: \[train\] max_grad_norm = inf; give a finite"),
    (["--set", "data.valid.header=false"], r"\[data\] valid has no path \(set data\.valid\.path\)$"),
    (["--valid-file", "v.tsv", "--valid-size", "1.5"], r"^--valid-size: \[data\] valid_size must"),
    (["--set", "data.test.format=xml"], r"^--set data\.test\.format=xml: \[data\] test\.format = "
                                        r"'xml'; choose one of auto, csv"),  # (checked at the read)
])
def test_values_that_would_fail_late_or_write_elsewhere_are_refused_naming_the_option(
        toy_task, given, message):
    """A name with / was a FileNotFoundError traceback ("../x" wrote outside runs/); NaN passed
    every range check (a torch traceback, or a "lower the lr" error); the advice named an option
    eval has not; --valid-file was blamed for valid_size as its key is a prefix of the other."""
    with pytest.raises(ConfigError, match=message):
        resolve_task(build_parser().parse_args(["train", "--task", str(toy_task), *given]))


def test_a_task_file_saved_with_a_byte_order_mark_is_read(toy_task):
    """Windows' Notepad writes one; TOML has no place for it ("Invalid statement at line 1")."""
    toy_task.write_bytes(b"\xef\xbb\xbf" + toy_task.read_bytes())
    assert resolve_task(build_parser().parse_args(["train", "--task", str(toy_task)])).name == "toy"


@pytest.mark.parametrize(("mistake", "line", "said"), [
    ('lr = "3e-5"', 9, " [train]: 'lr' must be float, got str '3e-5'"),
    ("lrr = 1e-3", 9, " [train]: unknown key 'lrr'"),
    ("lr = -1.0", 9, ": [train] lr must be at least 0"),
    ('test = {path = "t.tsv", headr = true}', 5, " [data] test: unknown key 'headr'"),
    ("colour = 1", 2, ": unknown key 'colour'"),
    ("[dta]\nx = 1", 2, ": unknown key 'dta'"),  # a misspelt table: its header's line
    ('test = {path = "t.tsv", format = "xml"}', 5, ": [data] test.format = 'xml'; choose one of"),
    ('labels = { neg = ["x"], pos = "p" }', 5, ": [data] labels: ['x'] is not a label's name"),
])
def test_a_mistake_in_a_task_file_names_its_line(tmp_path, mistake, line, said):
    """tomllib gives the line of a syntax error alone: a wrong key or value named the file."""
    from nlptrain.task_files import load_task

    text = 'name = "x"\n{top}\n[data]\ntrain = "a.tsv"\n{test}\n\n[train]\nepochs = 2\n{train}\n'
    parts = {"top": "", "test": 'test = "t.tsv"', "train": "lr = 1e-3"}
    key = {2: "top", 5: "test", 9: "train"}[line]
    (tmp_path / "t.toml").write_text(text.format(**{**parts, key: mistake}))
    with pytest.raises(ConfigError) as raised:
        load_task(tmp_path / "t.toml")
    assert str(raised.value).startswith(f"{tmp_path / 't.toml'}:{line}{said}"), str(raised.value)


@pytest.mark.parametrize(("before", "line"), [
    ('description = """\nTuned with\nepochs = 3 and lr = 5e-5\n"""\n', 6),
    ("# a description in \'\'\' quotes below\ndescription = \'\'\'\nepochs = 3 once\n\'\'\'\n", 6),
    ('description = "it\'\'\'s odd"\n', 3),
    ('description = """one line"""\n', 3),
    ('description = """\nhe said \\""" hi\nepochs = 3 text\n"""\n', 6),
    ('description = """x""" # ends with """\n', 3),  # a comment's quotes open nothing
    ('description = """\nHe said \\""""\n', 4),  # an escaped quote, then the closing ones
    ("description = '''\nC:\\'''\n", 4),  # a literal string escapes nothing
    ('description = "a\u2028b"\n# c\u2029d\x85e\n', 4),  # TOML ends lines at \n alone
])
def test_a_line_inside_a_multi_line_string_is_not_taken_for_the_key(tmp_path, before, line):
    """A description's text line "epochs = 3 ..." was named for the top-level key; a comment or
    a one-line string holding triple quotes threw the count of strings off."""
    from nlptrain.task_files import load_task

    (tmp_path / "t.toml").write_text(f'name = "x"\n{before}epochs = 3\n[train]\nlr = 5e-5\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 't.toml'))}:{line}: unknown "
                                          r"key 'epochs'"):
        load_task(tmp_path / "t.toml")
