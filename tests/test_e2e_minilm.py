"""End to end with the real pre-trained MiniLM on rt-polarity: a few dozen steps beat chance."""

from __future__ import annotations

import numpy as np
import torch
from conftest import REPO, SHARED_DATA, needs_shared_data

from nlptrain import TrainConfig, Trainer
from nlptrain.data import build_datasets
from nlptrain.models import load_model, load_tokenizer
from nlptrain.task_files import load_task


@needs_shared_data
def test_minilm_learns_rt_polarity_in_a_few_dozen_steps(tmp_path):
    task = load_task(REPO / "tasks" / "rt-polarity.toml")
    task.data_dir = str(SHARED_DATA)
    task.data.cache_dir = str(tmp_path / "cache")
    tokenizer = load_tokenizer(task.model.name)
    sets = build_datasets(task, tokenizer)
    assert len(sets.test) == 1067
    rng = np.random.default_rng(0)
    train = sets.train.select(rng.choice(len(sets.train), 48 * 16, replace=False))
    held_out = sets.test.select(np.arange(0, 1067, 3))  # 356 rows never trained on
    torch.manual_seed(0)
    model = load_model(task.model.name, sets.vocab.names)
    config = TrainConfig(epochs=1, batch_size=16, lr=1e-4, scheduler="constant", warmup_ratio=0)
    trainer = Trainer(model, train, held_out, config=config)
    before = trainer.evaluate(held_out)["accuracy"]
    after = trainer.fit()["accuracy"]
    assert trainer.global_step == 48
    assert after > 0.70 and after > before + 0.1, (before, after)
