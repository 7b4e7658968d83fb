"""A user's own `torch.nn.Module` and metric through the same loop: train, evaluate with the
user's metric on the gathered predictions, checkpoint and resume exactly, 1 and 2 processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ddp import run_ranks
from nlptrain.callbacks import Checkpointer
from own_model import MeanPoolClassifier, expected_rate, positive_rate, toy_sets

from nlptrain import Callback, TrainConfig, Trainer
from nlptrain.checkpoint import list_checkpoints, load_checkpoint
from nlptrain.kinds import SingleLabel

CONFIG = dict(epochs=2, batch_size=8, lr=1e-3, metric_for_best="positive_rate")


def make(folder, tiny_model_dir, callbacks=(), dist=None):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    train, test = toy_sets(folder, tokenizer)
    torch.manual_seed(0)
    model = MeanPoolClassifier(tiny_model_dir, 2)
    trainer = Trainer(model, train, test, config=TrainConfig(**CONFIG), callbacks=callbacks,
                      tokenizer=tokenizer, kind=SingleLabel(), label_names=["neg", "pos"],
                      metrics=[positive_rate], dist=dist)
    return trainer, test


def test_own_model_and_metric_train_evaluate_and_resume_exactly(tmp_path, tiny_model_dir):
    whole, test = make(tmp_path, tiny_model_dir, [Checkpointer(tmp_path / "ckpt", every=5, keep=0)])
    metrics = whole.fit()
    assert metrics["positive_rate"] == expected_rate(whole.unwrapped_model, test)
    assert {"accuracy", "macro_f1", "mcc", "f1", "positive_rate"} <= set(metrics)
    assert whole.global_step == 16 and whole.metric_for_best == "positive_rate"
    step10 = next(p for p in list_checkpoints(tmp_path / "ckpt") if p.name.endswith("10"))
    resumed, _ = make(tmp_path, tiny_model_dir)
    load_checkpoint(resumed, step10)  # mid-epoch 2: step 10 of 16
    resumed.fit()
    for (name, a), b in zip(whole.unwrapped_model.state_dict().items(),
                            resumed.unwrapped_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert resumed.metrics["positive_rate"] == metrics["positive_rate"]


def _two_ranks(rank: int, world_size: int, folder: str, model_dir: str) -> dict:
    from pathlib import Path

    from nlptrain.distributed import Distributed

    dist = Distributed(60)
    (Path(folder) / f"rank{rank}").mkdir()
    trainer, test = make(Path(folder) / f"rank{rank}", Path(model_dir), dist=dist)
    metrics = trainer.fit()
    found = {k: metrics[k] for k in ("accuracy", "positive_rate", "rows")}
    found["by_hand"] = expected_rate(trainer.unwrapped_model, test)  # the whole set, one process
    trainer.close()
    dist.close()
    return found


@pytest.mark.distributed
def test_own_model_under_ddp_evaluates_like_one_process(tmp_path, tiny_model_dir):
    results = run_ranks(_two_ranks, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    assert results[0] == results[1] and results[0]["rows"] == 40
    assert results[0]["positive_rate"] == results[0]["by_hand"]


def _unused_pooler(rank: int, world_size: int, folder: str, model_dir: str) -> str:
    from pathlib import Path

    from transformers import BertModel

    from nlptrain.distributed import Distributed
    from nlptrain.errors import ConfigError

    dist = Distributed(60)
    (Path(folder) / f"rank{rank}").mkdir()
    trainer, _ = make(Path(folder) / f"rank{rank}", Path(model_dir), dist=dist)
    trainer.unwrapped_model.encoder = BertModel.from_pretrained(model_dir)  # with its pooler
    trainer.model = trainer.strategy.rewrap(trainer.model)
    try:
        trainer.fit()
    except ConfigError as err:
        return str(err)
    finally:
        dist.close()
    return "trained"


@pytest.mark.distributed
def test_a_trainable_parameter_the_forward_never_uses_is_named_under_ddp(tmp_path, tiny_model_dir):
    """BertModel's pooler, unused by a head of the user's own on the token states: torch failed
    the second step, advising find_unused_parameters=True, which nlptrain does not pass."""
    said = run_ranks(_unused_pooler, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    assert said[0] == said[1] == (
        "DDP: 2 trainable parameter(s) got no gradient in the first step (encoder.pooler.dense."
        "weight, encoder.pooler.dense.bias), and DDP waits for every one: freeze them "
        "(param.requires_grad_(False)) or build the model without them (BertModel: "
        "add_pooling_layer=False)")


def test_a_metric_for_best_that_no_metric_gives_is_refused_before_training(tmp_path,
                                                                           tiny_model_dir):
    """Without metrics= of the user's own, the kind's are all there are: a misspelt name is an
    error at once, not after the first epoch's training (the CLI checks its task file alike)."""
    from nlptrain.errors import ConfigError

    model = MeanPoolClassifier(tiny_model_dir, 2)
    common = dict(kind=SingleLabel(), label_names=["neg", "pos"])
    with pytest.raises(ConfigError, match=r"metric_for_best = 'acc' is not a metric of "
                                          r"single_label tasks \(\[data\] kind\); "
                                          r"choose one of accuracy, macro_f1"):
        Trainer(model, config=TrainConfig(metric_for_best="acc"), **common)
    with pytest.raises(ConfigError, match=r"metric_for_best = 'f1' is the binary F1"):
        Trainer(model, config=TrainConfig(metric_for_best="f1"), kind=SingleLabel(),
                label_names=["a", "b", "c"])
    # A metric of the user's may give it: known only once it is computed.
    Trainer(model, config=TrainConfig(metric_for_best="acc"), metrics=[positive_rate], **common)


@pytest.mark.parametrize("outputs", [4, 3])
def test_evaluate_alone_refuses_a_model_of_another_width_than_the_labels(tmp_path, tiny_model_dir,
                                                                        outputs):
    """fit() refuses it at its first step; evaluate() alone (to score a model without training
    it) gave accuracy 0 for 4 outputs and 3 labels, unsaid, or a numpy error for 3 and 2."""
    from transformers import AutoTokenizer

    from nlptrain.errors import ConfigError

    _, test = toy_sets(tmp_path, AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    names = ["a", "b", "c"] if outputs == 4 else ["neg", "pos"]
    trainer = Trainer(MeanPoolClassifier(tiny_model_dir, outputs), kind=SingleLabel(),
                      label_names=names)
    with pytest.raises(ConfigError, match=rf"the model gives {outputs} output\(s\) a row, but "
                                          rf"this single_label task needs {len(names)}"):
        trainer.evaluate(test)


@pytest.mark.parametrize("given", ["dataset", "rows"])
def test_a_misspelt_metric_of_your_own_is_said_before_the_first_step(tmp_path, tiny_model_dir,
                                                                     caplog, given):
    """Known once computed, it was found at the first evaluation, after an epoch's training and
    before its checkpoint: computed first on a few evaluation rows, and said then (not refused:
    a metric's keys may depend on the rows) (reviews 122, 124). An evaluation set given as a list
    of rows has no select()."""
    from transformers import AutoTokenizer

    from nlptrain.errors import ConfigError

    train, test = toy_sets(tmp_path, AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    evaluated = test if given == "dataset" else [test[i] for i in range(len(test))]
    trainer = Trainer(MeanPoolClassifier(tiny_model_dir, 2), train, evaluated,
                      config=TrainConfig(**{**CONFIG, "metric_for_best": "positive_rte"}),
                      kind=SingleLabel(), label_names=["neg", "pos"], metrics=[positive_rate])
    seen = []

    class FirstStep(Callback):
        def on_batch_start(self, trainer, batch) -> None:
            seen.append(caplog.text)

    trainer.callbacks.callbacks.append(FirstStep())
    with caplog.at_level("WARNING", logger="nlptrain"), pytest.raises(ConfigError):
        trainer.fit()  # (the first evaluation)
    assert "metric_for_best = 'positive_rte' is not among the metrics of the evaluation set's " \
        "first 8 rows (accuracy, macro_f1, mcc, loss, f1, positive_rate)" in seen[0]


def test_a_metric_of_numpy_or_torch_numbers_checkpoints_and_resumes(tmp_path, tiny_model_dir):
    # scikit-learn's scores are np.float64: kept as they came, they went into the checkpoint
    # (best_metric, the best model's metrics), which torch.load(weights_only=True) then refused.
    import numpy as np
    from toy_trainer import toy_datasets

    from nlptrain.models import load_model

    train, test = toy_datasets(tmp_path, tiny_model_dir)

    def scores(found):
        return {"score": np.float64(0.5), "rate": torch.tensor(0.25), "per_row": np.ones(2)}

    def make(**extra):
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                       config=TrainConfig(epochs=1, batch_size=8, metric_for_best="score"),
                       metrics=[scores], **extra)

    first = make(callbacks=[Checkpointer(tmp_path / "ckpt")])
    metrics = first.fit()
    assert (type(first.best_metric), metrics["rate"], metrics["per_row"]) == (float, 0.25, [1.0, 1.0])
    assert make(resume_from=tmp_path / "ckpt").global_step == first.global_step == 3


@pytest.mark.parametrize("best_is, best_epoch", [("auto", 3), ("lower", 1), ("higher", 3)])
def test_best_is_tells_which_way_the_users_own_metric_improves(tmp_path, tiny_model_dir, best_is,
                                                               best_epoch):
    """An error metric of the user's (here one that grows each evaluation: 1, 2, 3) is better
    lower: `best_is = "lower"` picks the first evaluation; by name alone ("auto"), an unknown
    metric is better higher."""
    from toy_trainer import toy_datasets

    from nlptrain.models import load_model

    train, test = toy_datasets(tmp_path, tiny_model_dir)
    calls = []

    def rmse(found):
        if len(found.labels) == len(test):  # (not the few rows metric_for_best is checked on)
            calls.append(None)
        return {"rmse": float(len(calls))}

    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                      config=TrainConfig(epochs=3, batch_size=8, metric_for_best="rmse",
                                         best_is=best_is), metrics=[rmse])
    trainer.fit()
    assert trainer.best_metric == float(best_epoch)


def test_the_readmes_export_call_takes_a_folder_name_as_a_string(tmp_path, tiny_model_dir):
    """`trainer.strategy.export(trainer.model, tokenizer, folder)` as the README writes it, with
    `folder` a str: the module's weights and the tokenizer, loadable into a rebuilt module."""
    from safetensors.torch import load_model

    trainer, _ = make(tmp_path, tiny_model_dir)
    trainer.strategy.export(trainer.model, trainer.tokenizer, str(tmp_path / "export"))
    rebuilt = MeanPoolClassifier(tiny_model_dir, 2)
    load_model(rebuilt, str(tmp_path / "export" / "model.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.state_dict().values(),
                                                 trainer.model.state_dict().values(), strict=True))
    assert (tmp_path / "export" / "tokenizer.json").is_file()


def test_a_metric_that_returns_no_dict_is_named_in_one_error():
    import numpy as np

    from nlptrain.errors import ConfigError
    from nlptrain.evaluate import Predictions, compute_metrics

    def rmse(found):
        return 0.41  # the number alone, not {"rmse": 0.41}

    found = Predictions(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 1]))
    with pytest.raises(ConfigError, match=r"metrics= function rmse returned a float \(0\.41\): "
                                          r"return a dict of name -> number"):
        compute_metrics(found, ["neg", "pos"], metric_fns=[rmse])


@pytest.mark.parametrize("returned, says", [
    ({"accuracy": 0.5}, r"metrics= function mine returned 'accuracy', a metric this task already "
                        r"reports; give yours another name, e\.g\. 'mine_accuracy'"),
    ({"step": 123.0}, r"metrics= function mine returned 'step', which the trainer adds to every "
                      r"evaluation's metrics; give yours another name, e\.g\. 'mine_step'"),
    ({"note": "good"}, r"metrics= function mine returned 'note': str \(good\), not a number"),
    ({"score": None}, r"metrics= function mine returned 'score': NoneType"),
])
def test_a_metric_that_shadows_a_builtin_or_is_no_number_is_refused(returned, says):
    import numpy as np

    from nlptrain.errors import ConfigError
    from nlptrain.evaluate import Predictions, compute_metrics

    def mine(found):
        return returned

    found = Predictions(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 1]))
    with pytest.raises(ConfigError, match=says):
        compute_metrics(found, ["neg", "pos"], metric_fns=[mine])


def test_the_libraries_metric_warnings_are_said_by_the_main_rank_alone():
    """Every rank computes the same metrics from the gathered predictions, so scikit-learn's
    warnings (one class in the set, say) would be said once a rank; the others pass warn=False."""
    import warnings

    import numpy as np

    from nlptrain.evaluate import Predictions, compute_metrics

    one_class = Predictions(np.array([[0.9, 0.1], [0.8, 0.2]], dtype=np.float32), np.array([0, 0]))
    for warn in (True, False):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            compute_metrics(one_class, ["neg", "pos"], warn=warn)
        assert bool(said) == warn, [str(w.message) for w in said]


def test_a_resume_keeps_the_direction_its_best_was_picked_in(tmp_path, tiny_model_dir):
    """A resume with another best_is would judge every later score the other way round (the
    command line refused it; the library took it, silently)."""
    from toy_trainer import toy_datasets

    from nlptrain.errors import CheckpointError
    from nlptrain.models import load_model

    train, test = toy_datasets(tmp_path, tiny_model_dir)

    def make(best_is: str, **more) -> Trainer:
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                       config=TrainConfig(epochs=1, batch_size=8, metric_for_best="err",
                                          best_is=best_is), metrics=[lambda found: {"err": 0.5}],
                       progress=False, **more)

    make("lower", callbacks=[Checkpointer(tmp_path / "ckpt")]).fit()
    with pytest.raises(CheckpointError, match=r"picked with best_is = 'lower'; resume with that, "
                       r"not 'auto'"):
        make("auto", resume_from=tmp_path / "ckpt")
    assert make("lower", resume_from=tmp_path / "ckpt").best_metric == 0.5


def test_metric_for_best_must_name_a_number_not_a_list(tmp_path, tiny_model_dir):
    """A list-valued metric (per class, say) ordered "best" by comparing lists, and early
    stopping then failed formatting it: one error at the evaluation that shows it."""
    from toy_trainer import toy_datasets

    from nlptrain.errors import ConfigError
    from nlptrain.models import load_model

    train, test = toy_datasets(tmp_path, tiny_model_dir)
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                      config=TrainConfig(epochs=1, batch_size=8, metric_for_best="per"),
                      metrics=[lambda found: {"per": [1.0, 0.0]}], progress=False)
    with pytest.raises(ConfigError, match=r"metric_for_best = 'per' is not a number: pick one of "
                       r"accuracy, "):
        trainer.fit()
    # A number of any name picks, also one named like a count the tables leave out.
    picked = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                     config=TrainConfig(epochs=1, batch_size=8, metric_for_best="threshold"),
                     metrics=[lambda found: {"threshold": np.float32(0.5)}], progress=False)
    picked.fit()
    assert picked.best_metric == 0.5


def test_two_emas_that_evaluate_are_refused(tmp_path, tiny_model_dir):
    """Each swaps its average in and out around an evaluation: the second put the first's
    average back as the weights to train on. One evaluating EMA, the others evaluate=False."""
    from nlptrain.callbacks import EMA
    from toy_trainer import toy_datasets

    from nlptrain.errors import ConfigError
    from nlptrain.models import load_model

    train, test = toy_datasets(tmp_path, tiny_model_dir)

    def fit(*callbacks) -> None:
        Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                config=TrainConfig(epochs=1, batch_size=8, max_steps=2), callbacks=callbacks,
                progress=False).fit()

    with pytest.raises(ConfigError, match=r"2 EMA callbacks evaluate their average"):
        fit(EMA(0.5), EMA(0.9))
    fit(EMA(0.5), EMA(0.9, evaluate=False))


    class MyEMA(EMA):
        pass

    # A subclass of yours replaces ema_decay's, as EMA itself does: the README says so, and the
    # refusal's advice (evaluate=False) is not one a user can give the EMA the config makes.
    mine = MyEMA(0.9)
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test, callbacks=[mine],
                      config=TrainConfig(epochs=1, batch_size=8, max_steps=2, ema_decay=0.99),
                      progress=False)
    assert [c for c in trainer.callbacks.callbacks if isinstance(c, EMA)] == [mine]


def test_an_optimizer_replaced_after_a_resume_loaded_the_checkpoint_is_refused(tmp_path,
                                                                              tiny_model_dir):
    """The checkpoint loads into the Trainer's own optimizer; one put in its place after that
    would go on without the saved state (or fail on its groups). Refused, naming optimizer=."""
    from toy_trainer import toy_datasets

    from nlptrain.errors import ConfigError
    from nlptrain.models import load_model

    train, test = toy_datasets(tmp_path, tiny_model_dir)

    def make(epochs: int = 1, **more) -> Trainer:
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                       config=TrainConfig(epochs=epochs, batch_size=8), progress=False, **more)

    class SwapOptimizer(Callback):
        def on_train_start(self, trainer) -> None:
            trainer.optimizer = torch.optim.SGD(trainer.unwrapped_model.parameters(), lr=0.1)

    make(callbacks=[Checkpointer(tmp_path / "ckpt")]).fit()
    resumed = make(resume_from=tmp_path / "ckpt")
    resumed.optimizer = torch.optim.SGD(resumed.unwrapped_model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"give Trainer\(optimizer=make\) instead"):
        resumed.fit()
    with pytest.raises(ConfigError, match=r"give Trainer\(optimizer=make\) instead"):
        make(resume_from=tmp_path / "ckpt", callbacks=[SwapOptimizer()]).fit()  # in on_train_start
    again = make(2, resume_from=tmp_path / "ckpt")
    again.fit()  # its state used: a later fit may go on with another optimizer
    again.optimizer = torch.optim.SGD(again.unwrapped_model.parameters(), lr=0.1)
    again.fit()
    fresh = make()  # no resume: any optimizer may be put in its place
    fresh.optimizer = torch.optim.SGD(fresh.unwrapped_model.parameters(), lr=0.1)
    fresh.fit()
