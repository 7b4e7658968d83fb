"""The loop's counters are one object: a checkpoint carries every field, the trainer reads them."""

from __future__ import annotations

import dataclasses

import pytest
from toy_trainer import make_trainer

from nlptrain.progress import Progress


def test_state_dict_carries_every_field_and_loads_back():
    names = [f.name for f in dataclasses.fields(Progress)]
    progress = Progress(**{name: i + 1 for i, name in enumerate(names)})
    state = progress.state_dict()
    assert list(state) == names  # a new field is in every checkpoint without more code
    restored = Progress()
    restored.load_state_dict(state)
    assert restored == progress
    older = Progress()
    older.load_state_dict({k: v for k, v in state.items() if k != "steps_per_epoch"})
    assert older.steps_per_epoch == 0 and older.global_step == progress.global_step


def test_the_trainer_reads_its_counters_from_progress(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, [], epochs=1)
    trainer.fit()
    assert trainer.global_step == trainer.progress.global_step == 3
    assert trainer.progress_state() == trainer.progress.state_dict()
    with pytest.raises(AttributeError):
        trainer.global_step = 0  # one owner: the loop, through trainer.progress
