"""Fine-tuning techniques on one process: losses, parameter groups, EMA, FGM, R-Drop (freezing:
test_freeze.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from finetune_setup import RecordSteps, hand_ema, snapshot, tiny_model, toy_sets
from nlptrain.callbacks import EMA, FGM, Checkpointer, Freeze, RDrop

from nlptrain import TrainConfig, Trainer
from nlptrain.checkpoint import load_checkpoint, save_checkpoint
from nlptrain.cli import main
from nlptrain.cpu_dropout import use_cpu_dropout
from nlptrain.errors import ConfigError
from nlptrain.evaluate import model_inputs
from nlptrain.kinds import MultiLabel, Regression, SingleLabel
from nlptrain.losses import task_loss
from nlptrain.task_files import task_from_dict

# -- class weights and label smoothing ---------------------------------------------------------


def test_weighted_loss_equals_torch_cross_entropy():
    torch.manual_seed(0)
    logits, targets = torch.randn(12, 3), torch.tensor([0, 1, 2, 2, 2, 2, 1, 2, 2, 0, 2, 2])
    weights = [2.0, 1.0, 0.5]
    loss = task_loss(SingleLabel(), TrainConfig(class_weights=weights), None, ["a", "b", "c"])
    expected = torch.nn.CrossEntropyLoss(weight=torch.tensor(weights))(logits, targets)
    assert torch.allclose(loss(logits, targets), expected)
    smoothed = task_loss(SingleLabel(), TrainConfig(class_weights=weights, label_smoothing=0.1),
                         None, ["a", "b", "c"])
    expected = torch.nn.CrossEntropyLoss(weight=torch.tensor(weights), label_smoothing=0.1)
    assert torch.allclose(smoothed(logits, targets), expected(logits, targets))


def test_balanced_weights_come_from_the_training_targets(tmp_path, tiny_model_dir):
    train, _ = toy_sets(tmp_path, tiny_model_dir)
    counts = np.bincount(train.label_ids, minlength=2)
    loss = task_loss(SingleLabel(), TrainConfig(class_weights="balanced"), train, ["neg", "pos"])
    logits, targets = torch.randn(6, 2), torch.tensor([0, 1, 1, 0, 1, 1])
    balanced = torch.tensor(len(train) / (2 * counts), dtype=torch.float32)  # n / (classes * count)
    assert torch.allclose(loss(logits, targets), F.cross_entropy(logits, targets, weight=balanced))
    # A list of the set's rows is the same set (it was refused: "no training targets").
    from nlptrain.data.hf_datasets import RowList

    listed = RowList([train[i] for i in range(len(train))])
    listed_loss = task_loss(SingleLabel(), TrainConfig(class_weights="balanced"), listed, ["neg", "pos"])
    assert torch.equal(listed_loss(logits, targets), loss(logits, targets))
    # Multi-label: BCE's pos_weight, negatives over positives of each label.
    multi = np.array([[1, 0, 1], [0, 0, 1], [1, 0, 1], [0, 1, 0]], dtype=np.float32)

    class Targets:
        label_ids = multi

    bce = task_loss(MultiLabel(), TrainConfig(class_weights="balanced"), Targets(), ["x", "y", "z"])
    logits = torch.randn(4, 3)
    pos_weight = torch.tensor([2 / 2, 3 / 1, 1 / 3])
    assert torch.allclose(bce(logits, torch.from_numpy(multi)),
                          torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)(logits, torch.from_numpy(multi)))
    # A label of every row has no negatives: weighted 1, not 0 (never learned).
    Targets.label_ids = everywhere = np.c_[multi, np.ones(4, dtype=np.float32)]
    bce = task_loss(MultiLabel(), TrainConfig(class_weights="balanced"), Targets(), ["x", "y", "z", "w"])
    logits = torch.randn(4, 4)
    pos_weight = torch.tensor([2 / 2, 3 / 1, 1 / 3, 1])
    targets = torch.from_numpy(everywhere)
    assert torch.allclose(bce(logits, targets),
                          torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)(logits, targets))


def test_class_weights_and_smoothing_refuse_what_they_do_not_fit():
    def task(kind: str, **train) -> None:
        task_from_dict({"data": {"kind": kind}, "train": train}, "t.toml")

    task("single_label", class_weights="balanced", label_smoothing=0.1)
    task("multi_label", class_weights=[1.0, 2.0])
    for kind, train, message in [
        ("regression", {"class_weights": "balanced"}, "regression task has none"),
        ("multi_label", {"label_smoothing": 0.1}, "single_label tasks, not multi_label"),
        ("single_label", {"class_weights": "even"}, "give 'balanced' or a list"),
        ("single_label", {"class_weights": [1, -1]}, "number >= 0"),
        ("single_label", {"label_smoothing": 1.0}, r"in \[0, 1\)"),
        ("single_label", {"layer_lr_decay": 0.0}, r"in \(0, 1\]")]:
        with pytest.raises(ConfigError, match=f"t.toml: .*{message}"):
            task(kind, **train)
    with pytest.raises(ConfigError, match="one number per label .2: neg, pos"):
        task_loss(SingleLabel(), TrainConfig(class_weights=[1.0]), None, ["neg", "pos"])
    with pytest.raises(ConfigError, match="no training row has the label.*'c'"):
        class Targets:
            label_ids = np.array([0, 1, 1])
        task_loss(SingleLabel(), TrainConfig(class_weights="balanced"), Targets(), ["a", "b", "c"])
    with pytest.raises(ConfigError, match="regression task has none"):
        Regression().loss(torch.zeros(2), torch.zeros(2), class_weights=torch.ones(1))


def test_the_keys_through_the_command_line(toy_task, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                 "--set", "train.class_weights=balanced", "--set", "train.label_smoothing=0.1",
                 "--set", "train.layer_lr_decay=0.9", "--set", "train.ema_decay=0.9"]) == 0
    assert json.loads((run / "results.json").read_text())["test"]["rows"] == 40
    assert main(["train", "--task", str(toy_task), "--set", "train.label_smoothing=2"]) != 0
    assert "[train] label_smoothing must be in [0, 1)" in capsys.readouterr().err


def test_balanced_weights_on_streaming_data_are_the_one_line_error(toy_task, tmp_path, capsys):
    # A stream's rows are not known ahead (its `label_ids` is the label vocabulary, not targets):
    # the README promises the error naming the key, not a TypeError from inside numpy, and before
    # the run directory is made (else the corrected command is refused: "already holds a run").
    assert main(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "run"),
                 "--streaming", "--set", "train.class_weights=balanced"]) == 1
    assert "class_weights = 'balanced' needs the training targets" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# -- parameter groups and the optimizer ---------------------------------------------------------


def test_layer_lr_decay_groups_and_their_checkpoint(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir)
    config = TrainConfig(lr=1e-3, layer_lr_decay=0.5, weight_decay=0.01, epochs=1, batch_size=8,
                         class_weights=[1.0, 2.0], label_smoothing=0.1)
    trainer = Trainer(tiny_model(tiny_model_dir), train, test, config=config)
    lrs = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    # 2 layers: head at lr, layer.1 x 0.5, layer.0 x 0.25, embeddings x 0.125.
    assert lrs == {f"{where}/{kind}": lr for where, lr in [
        ("head", 1e-3), ("layer.1", 5e-4), ("layer.0", 2.5e-4), ("embeddings", 1.25e-4)]
        for kind in ("decay", "no_decay")}
    named = dict(trainer.unwrapped_model.named_parameters())
    where = {id(p): g for g in trainer.optimizer.param_groups for p in g["params"]}
    assert len(where) == len(named)  # every parameter in exactly one group
    assert where[id(named["bert.encoder.layer.0.attention.self.query.weight"])]["lr"] == 2.5e-4
    assert where[id(named["bert.encoder.layer.1.output.LayerNorm.weight"])]["weight_decay"] == 0.0
    assert where[id(named["classifier.weight"])]["lr"] == 1e-3
    assert where[id(named["bert.pooler.dense.weight"])]["name"] == "head/decay"
    trainer.fit()
    save_checkpoint(trainer, tmp_path / "ckpt")
    after = {g["name"]: (g["lr"], g["initial_lr"]) for g in trainer.optimizer.param_groups}
    again = Trainer(tiny_model(tiny_model_dir), train, test, config=config)
    load_checkpoint(again, tmp_path / "ckpt")
    assert {g["name"]: (g["lr"], g["initial_lr"]) for g in again.optimizer.param_groups} == after


def test_param_groups_and_optimizer_can_be_replaced(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir)

    def head_only(model, lr, config):
        return [{"name": "head", "params": list(model.classifier.parameters()), "lr": lr * 10}]

    def sgd(groups, config):
        return torch.optim.SGD(groups, lr=config.lr)

    trainer = Trainer(tiny_model(tiny_model_dir), train, test, param_groups=head_only, optimizer=sgd,
                      config=TrainConfig(lr=1e-2, epochs=1, batch_size=8))
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [0.1]
    before = snapshot(trainer.unwrapped_model)
    trainer.fit()
    after = snapshot(trainer.unwrapped_model)
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])
    assert torch.equal(before["bert.pooler.dense.weight"], after["bert.pooler.dense.weight"])


def test_fgm_steps_plainly_while_the_embeddings_are_frozen(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir, rows=8)
    fgm = FGM(1.0)
    trainer = Trainer(tiny_model(tiny_model_dir), train, test, callbacks=[Freeze(1), fgm],
                      config=TrainConfig(epochs=1, batch_size=4))
    trainer.fit()
    assert trainer.global_step == 2 and fgm._restore is None


def test_a_checkpoint_holds_the_clean_weights_whatever_the_callbacks_order(tmp_path,
                                                                          tiny_model_dir):
    """FGM listed before Checkpointer: the step-2 checkpoint still holds the weights that step 2
    left, not the embeddings FGM moves for the next batch."""
    from safetensors.torch import load_file

    train, test = toy_sets(tmp_path, tiny_model_dir, rows=24)
    record = RecordSteps()
    trainer = Trainer(tiny_model(tiny_model_dir), train, None,
                      callbacks=[FGM(1.0), Checkpointer(tmp_path / "ckpt", every=2, keep=0), record],
                      config=TrainConfig(epochs=1, batch_size=4))
    trainer.fit()
    saved = load_file(tmp_path / "ckpt" / "step-00000002" / "model.safetensors")
    after_step_2 = record.weights[2]
    assert saved.keys() >= after_step_2.keys()
    assert all(torch.equal(saved[k], v) for k, v in after_step_2.items()), [
        k for k, v in after_step_2.items() if not torch.equal(saved[k], v)]


# -- EMA --------------------------------------------------------------------------------------


def test_ema_equals_its_definition_and_is_exported(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir)
    record, ema = RecordSteps(), EMA(decay=0.8)
    trainer = Trainer(tiny_model(tiny_model_dir), train, test, callbacks=[record, ema],
                      config=TrainConfig(epochs=2, batch_size=8, lr=1e-3, eval_every=2))
    trainer.fit()
    configured = Trainer(tiny_model(tiny_model_dir), train, test, callbacks=[record],
                         config=TrainConfig(ema_decay=0.5))
    assert isinstance(configured.callbacks.callbacks[-1], EMA)  # last: after SaveBestModel
    expected = hand_ema(record.weights, 0.8)
    for name, value in expected.items():
        torch.testing.assert_close(ema.average[name], value, rtol=1e-6, atol=1e-7)
        # export: the model ends with the averaged weights
        assert torch.equal(dict(trainer.unwrapped_model.named_parameters())[name], ema.average[name])


def test_best_model_holds_the_average_it_was_chosen_by(tmp_path, tiny_model_dir):
    """SaveBestModel before EMA saves the averaged weights that were evaluated; after it, it would
    save the training weights under the average's metrics: refused, naming the order to use."""
    from nlptrain.callbacks import SaveBestModel
    from safetensors.torch import load_file

    train, test = toy_sets(tmp_path, tiny_model_dir)
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-3)
    ema = EMA(decay=0.5, export=False)
    Trainer(tiny_model(tiny_model_dir), train, test, config=config,
            callbacks=[SaveBestModel(tmp_path / "best"), ema]).fit()
    best = load_file(tmp_path / "best" / "model.safetensors")
    assert all(torch.equal(best[name], value) for name, value in ema.average.items())
    wrong = Trainer(tiny_model(tiny_model_dir), train, test, config=config,
                    callbacks=[EMA(decay=0.5), SaveBestModel(tmp_path / "best2")])
    with pytest.raises(ConfigError, match="put SaveBestModel before EMA"):
        wrong.fit()
    assert not (tmp_path / "best2").exists()


# -- FGM --------------------------------------------------------------------------------------


def hand_fgm_grads(model, batches, epsilon: float, accumulate: int) -> dict[str, torch.Tensor]:
    """FGM written out: per micro-batch, clean backward, perturb along its embedding gradient,
    adversarial backward, restore."""
    weight = model.get_input_embeddings().weight
    for batch in batches:
        before = weight.grad.clone() if weight.grad is not None else torch.zeros_like(weight)
        out = model(**model_inputs(batch)).logits
        (F.cross_entropy(out, batch["labels"]) / accumulate).backward()
        g = weight.grad - before
        backup = weight.detach().clone()
        with torch.no_grad():
            weight += epsilon * g / g.norm()
        out = model(**model_inputs(batch)).logits
        (F.cross_entropy(out, batch["labels"]) / accumulate).backward()
        with torch.no_grad():
            weight.copy_(backup)
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def test_fgm_gradient_equals_a_hand_written_fgm_step(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir, rows=16)
    record = RecordSteps()
    config = TrainConfig(epochs=1, batch_size=4, grad_accum=2, lr=1e-3, max_grad_norm=0,
                         group_by_length=False)
    trainer = Trainer(tiny_model(tiny_model_dir, dropout=False), train, test,
                      callbacks=[FGM(epsilon=0.5), record], config=config)
    loader = trainer.train_batches.loader(train, lambda data: data, trainer.config, trainer.collate)
    loader.sampler.set_epoch(0)
    first_two = list(iter(loader))[:2]
    trainer.fit()
    model = tiny_model(tiny_model_dir, dropout=False)
    model.train()
    expected = hand_fgm_grads(model, first_two, 0.5, accumulate=2)
    assert record.grads[0].keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(record.grads[0][name], grad, rtol=1e-5, atol=1e-7)
    # The embeddings were restored: step 1 moved them by the optimizer alone, not by +r.
    assert np.isfinite(trainer.last_loss)


# -- R-Drop -----------------------------------------------------------------------------------


def test_rdrop_loss_equals_a_hand_computation(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir)
    seen = {}

    class KeepLoss(RDrop):
        def on_loss(self, trainer, loss):
            if "loss" not in seen:
                seen["loss"] = loss.detach()
                seen["rng"] = self.rng_before

        def on_batch_start(self, trainer, batch):
            if "batch" not in seen:
                seen["batch"] = batch
                self.rng_before = torch.get_rng_state()

    trainer = Trainer(tiny_model(tiny_model_dir), train, test, callbacks=[KeepLoss(alpha=2.0)],
                      config=TrainConfig(epochs=1, batch_size=8, lr=1e-3))
    task_loss_fn = trainer.loss_fn
    trainer.fit()
    model = tiny_model(tiny_model_dir)
    use_cpu_dropout(model)  # the dropout a CPU Trainer runs
    model.train()
    torch.set_rng_state(seen["rng"])  # the same two dropout masks
    first = model(**model_inputs(seen["batch"])).logits
    second = model(**model_inputs(seen["batch"])).logits
    labels = seen["batch"]["labels"]
    p, q = first.log_softmax(-1), second.log_softmax(-1)
    kl_pq = (p.exp() * (p - q)).sum(-1)
    kl_qp = (q.exp() * (q - p)).sum(-1)
    expected = ((F.cross_entropy(first, labels) + F.cross_entropy(second, labels)) / 2
                + 2.0 * ((kl_pq + kl_qp) / 2).mean())
    torch.testing.assert_close(seen["loss"], expected.detach(), rtol=1e-5, atol=1e-6)
    assert trainer.loss_fn is task_loss_fn  # the seam is given back at the end
