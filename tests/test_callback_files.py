"""`--callback FILE.py:Class`: a file or class that cannot serve is one error naming the spec
(and the file's line), before any worker starts or the run directory is made; a valid file
loads as an import would."""

from __future__ import annotations

import pytest
from cli_errors import train


def test_a_missing_callback_file_is_one_error_before_any_worker_starts(capsys, toy_task, tmp_path):
    missing = tmp_path / "nope.py"
    code, err = train(capsys, toy_task, tmp_path / "run", "--nproc", "2", "--callback",
                      f"{missing}:Notify")
    assert code == 1 and err.count("error:") == 1, err
    assert f"error: --callback {missing}:Notify: file {missing} not found" in err
    assert "launched by" not in err and not (tmp_path / "run").exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.distributed
def test_a_callback_file_that_fails_to_load_on_every_rank_is_one_error(capsys, toy_task, tmp_path):
    """Under --nproc, a syntax error is said before any worker starts; an error of the file's own
    code (at import) by local rank 0 alone. Each rank used to say it, and the launcher blamed
    whichever rank failed first."""
    from conftest import run_cli

    mine = tmp_path / "mine.py"
    mine.write_text("from nlptrain import Callback\n\nclass Notify(Callback)\n    pass\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--nproc", "2", "--callback",
                      f"{mine}:Notify")
    assert code == 1 and err.count("error:") == 1 and "launched by" not in err, err
    assert f"error: {mine}:3: expected ':' (--callback {mine}:Notify)" in err
    # Local rank 0, slower here (a busy machine), says it: rank 1 used to exit first, and the
    # launcher stopped rank 0 before it spoke (no error shown at all).
    mine.write_text("import os, time\nif os.environ['LOCAL_RANK'] == '0': time.sleep(3)\n"
                    "raise KeyError('HOOK_URL')\n")
    done = run_cli(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "run"),
                    "--nproc", "2", "--callback", f"{mine}:Notify"], cwd=tmp_path)
    said = f"{mine}:3: KeyError: 'HOOK_URL' (--callback {mine}:Notify)"
    assert done.returncode == 1 and done.stderr.count(said) == 1, done.stderr
    assert "[rank 1]" not in done.stderr and "rank 0 of 2 failed" in done.stderr
    # An error of rank 1's alone (its environment, say): local rank 0 says nothing, so rank 1 does.
    mine.write_text("import os\nfrom nlptrain import Callback\n\nclass Notify(Callback):\n"
                    "    def __init__(self):\n        if os.environ['LOCAL_RANK'] == '1':\n"
                    "            raise KeyError('HOOK_URL')\n")
    done = run_cli(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "run"),
                    "--nproc", "2", "--callback", f"{mine}:Notify"], cwd=tmp_path)
    assert f"[rank 1] error: {mine}:7: KeyError: 'HOOK_URL'" in done.stderr, done.stderr


def test_a_callback_that_cannot_take_its_events_arguments_leaves_no_run_dir(capsys, toy_task,
                                                                             tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("from nlptrain import Callback\n\nclass Notify(Callback):\n"
                    "    def on_valid_end(self, trainer):\n        pass\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:Notify")
    assert code == 1
    assert f"error: --callback {mine}:Notify: callback Notify.on_valid_end(trainer) cannot take " \
        "the event's arguments" in err, err
    assert not (tmp_path / "run").exists()
    mine.write_text("from nlptrain import Callback\n\nclass Notify(Callback):\n"
                    "    def __init__(self, url):\n        self.url = url\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:Notify")
    assert code == 1 and "Traceback" not in err and not (tmp_path / "run").exists()
    assert f"error: --callback {mine}:Notify: missing a required argument: 'url'; a --callback " \
           "class is made without arguments" in err
    mine.write_text("from nlptrain import Callback\n\nclass Notify(Callback)\n    pass\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:Notify")
    assert code == 1 and "Traceback" not in err and not (tmp_path / "run").exists()
    assert f"error: {mine}:3: expected ':' (--callback {mine}:Notify)" in err, err


def test_a_callbacks_init_that_raises_is_one_line_at_its_line(capsys, toy_task, tmp_path):
    """It was a traceback (on each rank, under --nproc)."""
    mine = tmp_path / "mine.py"
    mine.write_text("import os\nfrom nlptrain import Callback\n\nclass Notify(Callback):\n"
                    "    def __init__(self):\n        self.url = os.environ['HOOK_URL_UNSET']\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:Notify")
    assert code == 1 and "Traceback" not in err and not (tmp_path / "run").exists()
    assert f"error: {mine}:6: KeyError: 'HOOK_URL_UNSET' (--callback {mine}:Notify)" in err, err


@pytest.mark.parametrize(("spec", "said"), [
    ("instance", "names a Notify instance, not a class: name the Callback class itself"),
    ("LIMIT", "names the value 3, not a class"),
    ("make", "names the function 'make', not a class"),  # not called: no side effects
    ("Plain", "Plain is not a Callback: subclass nlptrain.Callback"),
    ("Notify:3", "expected FILE.py:CLASS or MODULE:CLASS, with no arguments"),
    ("Nope", "{mine} defines no 'Nope'"),  # (not the module name nlptrain loaded it under)
])
def test_a_callback_spec_naming_no_callback_class_says_what_it_names(capsys, toy_task, tmp_path,
                                                                     monkeypatch, spec, said):
    """It said a non-callable needed parameter defaults, named neither spec nor file for a
    class that is no Callback (after calling a function to find out), and read Notify:3 as a
    module 'mine.py:Notify'."""
    mine = tmp_path / "mine.py"
    mine.write_text("from nlptrain import Callback\n\nclass Notify(Callback):\n    pass\n\n"
                    "class Plain:\n    pass\n\ninstance = Notify()\nLIMIT = 3\n\n"
                    "def make():\n    open('called', 'w').close()\n    return Notify()\n")
    monkeypatch.chdir(tmp_path)
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:{spec}")
    assert code == 1 and f"error: --callback {mine}:{spec}: {said.format(mine=mine)}" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "called").exists()


def test_a_callback_file_of_a_dataclass_with_postponed_annotations_loads(capsys, toy_task,
                                                                        tmp_path):
    """dataclasses looks its module up in sys.modules, where the loaded file was not: "cannot
    load it ('NoneType' object has no attribute '__dict__')"."""
    mine = tmp_path / "mine.py"
    mine.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n"
                    "from nlptrain import Callback\n\n@dataclass\nclass Notify(Callback):\n"
                    "    threshold: float = 0.9\n")
    from nlptrain.user_callbacks import make_callback

    assert make_callback(f"{mine}:Notify").threshold == 0.9


def test_one_file_named_twice_runs_once_as_an_import_does(tmp_path):
    """Each spec ran the file again as a module of its own: two callbacks of one file shared no
    module state, and the first's class was no longer its module's."""
    import sys

    from nlptrain.user_callbacks import make_callback

    mine = tmp_path / "two.py"
    mine.write_text("from nlptrain import Callback\n\nMADE = []\n\nclass A(Callback):\n"
                    "    def __init__(self):\n        MADE.append('A')\n\n"
                    "class B(Callback):\n    def __init__(self):\n        MADE.append('B')\n")
    a, b = make_callback(f"{mine}:A"), make_callback(f"{mine}:B")
    module = sys.modules[type(a).__module__]
    assert module is sys.modules[type(b).__module__] and module.MADE == ["A", "B"]
    assert isinstance(a, module.A)


def test_a_callback_file_imports_a_module_beside_it(tmp_path, monkeypatch):
    """As `python FILE.py` would: the file's helpers sit beside it (it got 'No module named')."""
    import sys

    from nlptrain.user_callbacks import make_callback

    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notify_helpers.py").write_text("GREETING = 'hello'\n")
    (folder / "notify.py").write_text("from nlptrain import Callback\nimport notify_helpers\n\n"
                                      "class Notify(Callback):\n"
                                      "    greeting = notify_helpers.GREETING\n")
    monkeypatch.chdir(tmp_path)
    assert make_callback("mine/notify.py:Notify").greeting == "hello"
    assert sys.path[-1] == str(folder)  # last: it shadows no installed package


def test_a_file_rewritten_within_the_same_second_runs_its_new_bytes(tmp_path, monkeypatch):
    """Python's loader took a __pycache__ .pyc of the same mtime second and size: the old class."""
    import os
    import sys

    from nlptrain.user_callbacks import make_callback

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    mine = tmp_path / "changing.py"
    for value in (1, 2, 3):
        mine.write_text(f"from nlptrain import Callback\n\nclass A(Callback):\n    V = {value}\n")
        os.utime(mine, (1_700_000_000, 1_700_000_000))  # one second for every version
        assert make_callback(f"{mine}:A").V == value


def test_a_callback_file_holding_a_nul_byte_is_named(capsys, toy_task, tmp_path):
    """compile's error of a NUL byte names no file and no line: it read 'None:None: ...'."""
    mine = tmp_path / "nul.py"
    mine.write_bytes(b"from nlptrain import Callback\n\x00\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:N")
    assert code == 1 and f"error: {mine}: source code string cannot contain null bytes " \
        f"(--callback {mine}:N)" in err, err


@pytest.mark.parametrize(("line", "said"), [
    ("import os\nos.no_such_function()", "2: AttributeError: module 'os' has no attribute"),
    ("SETTINGS = {}\nURL = SETTINGS['url']", "2: KeyError: 'url'"),
])
def test_a_callback_file_failing_as_it_loads_is_named_with_its_line(capsys, toy_task, tmp_path,
                                                                   line, said):
    """A KeyError was a traceback through importlib; an AttributeError lost the file and line."""
    mine = tmp_path / "mine.py"
    mine.write_text(f"{line}\n\nfrom nlptrain import Callback\n\nclass Notify(Callback):\n    pass\n")
    code, err = train(capsys, toy_task, tmp_path / "run", "--callback", f"{mine}:Notify")
    assert code == 1 and "Traceback" not in err and not (tmp_path / "run").exists()
    assert f"error: {mine}:{said}" in err and f"(--callback {mine}:Notify)" in err, err


def test_a_class_of_a_file_with_a_dot_in_its_name_pickles(tmp_path):
    """my.cb.py's module was named as a package's child: pickle could not find it."""
    import pickle

    from nlptrain.user_callbacks import make_callback

    mine = tmp_path / "my.cb.py"
    mine.write_text("import dataclasses\nfrom nlptrain import Callback\n\n@dataclasses.dataclass\n"
                    "class Notify(Callback):\n    url: str = 'x'\n")
    made = make_callback(f"{mine}:Notify")
    assert pickle.loads(pickle.dumps(made)).url == "x"


@pytest.mark.parametrize("level", ["info", "warning"])
def test_a_callback_files_own_logger_follows_the_log_level(capsys, toy_task, tmp_path, level):
    """Its info lines were lost (only the root's last-resort handler, at warnings, took them)."""
    import logging

    mine = tmp_path / "talk.py"
    mine.write_text("import logging\nfrom nlptrain import Callback\n"
                    "log = logging.getLogger(__name__)\n\nclass Talk(Callback):\n"
                    "    def on_train_start(self, trainer):\n        log.info('my info line')\n"
                    "        log.warning('mind this')\n")
    root = logging.getLogger()
    handlers = root.handlers[:]
    try:
        code, err = train(capsys, toy_task, tmp_path / "run", "--max-steps", "1", "--log-level",
                          level, "--callback", f"{mine}:Talk")
    finally:
        root.handlers[:] = handlers
    assert code == 0, err
    assert ("\nmy info line\n" in err) == (level == "info"), err
    assert "warning: mind this\n" in err and "WARNING" not in err


def test_an_ema_exporting_an_average_it_never_evaluated_is_the_model_kept(capsys, toy_task, tmp_path):
    """EMA(evaluate=False, export=True) with a validation set: best/ (the trained weights' best)
    was loaded over the exported average, so model/ was not the average the README promises."""
    import json

    from safetensors.torch import load_file

    from nlptrain.cli import main

    mine = tmp_path / "ema.py"
    mine.write_text("from nlptrain.callbacks import EMA\n\nclass TrainedOnly(EMA):\n"
                    "    def __init__(self):\n        super().__init__(0.5, evaluate=False, export=True)\n")
    run = tmp_path / "run"
    code, err = train(capsys, toy_task, run, "--callback", f"{mine}:TrainedOnly", "--valid-size",
                      "0.25", "--precision", "fp32")
    assert code == 0, err
    kept, best = load_file(run / "model" / "model.safetensors"), load_file(run / "best" / "model.safetensors")
    assert not kept["classifier.weight"].equal(best["classifier.weight"])  # the average, not best/
    report = (run / "report.md").read_text()  # which said model/ was the best, as in best/
    assert "test, the weights' average at the end (EMA), not `best/` (model/)" in report
    assert "as in `best/`" not in report
    assert main(["eval", "--model", str(run / "model"), "--task", str(toy_task), "--split", "valid",
                 "--set", "data.valid_size=0.25", "--precision", "fp32", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    valid = json.loads((run / "results.json").read_text())["valid"]
    assert scored["loss"] == pytest.approx(valid["loss"], rel=1e-5)  # its scores are the kept model's


@pytest.mark.parametrize(("evaluate", "export"), [(False, True), (True, False)])
def test_without_a_validation_set_the_test_scores_are_the_exported_models(capsys, toy_task, tmp_path,
                                                                         evaluate, export):
    """An EMA that exports what it did not evaluate (or evaluates what it does not export): the
    last evaluation, on the test set, scored other weights than model/'s, and results.json kept
    them (reviews 119, 120)."""
    import json

    from nlptrain.cli import main

    mine = tmp_path / "ema.py"
    mine.write_text("from nlptrain.callbacks import EMA\n\nclass Mine(EMA):\n    def __init__(self):\n"
                    f"        super().__init__(0.5, evaluate={evaluate}, export={export})\n")
    run = tmp_path / "run"
    code, err = train(capsys, toy_task, run, "--callback", f"{mine}:Mine", "--precision", "fp32")
    assert code == 0, err
    assert main(["eval", "--model", str(run / "model"), "--task", str(toy_task), "--precision",
                 "fp32", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    test = json.loads((run / "results.json").read_text())["test"]
    assert scored["loss"] == pytest.approx(test["loss"], rel=1e-5)
