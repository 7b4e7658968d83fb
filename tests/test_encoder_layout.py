"""Where each parameter of a transformers classifier sits for layer-wise lr decay and Freeze:
the embeddings, a layer, or the head, for the model families people fine-tune."""

from __future__ import annotations

import pytest
import transformers

from nlptrain.config import TrainConfig
from nlptrain.optim import encoder_layout, param_groups

SMALL = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64}


def tiny(family: str):
    configs = {
        "bert": transformers.BertConfig(**SMALL),
        "roberta": transformers.RobertaConfig(**SMALL),
        "electra": transformers.ElectraConfig(**SMALL, embedding_size=16),
        "deberta-v2": transformers.DebertaV2Config(**SMALL, relative_attention=True,
                                                   norm_rel_ebd="layer_norm", position_buckets=8),
        "distilbert": transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2,
                                                    hidden_dim=64),
    }
    return transformers.AutoModelForSequenceClassification.from_config(configs[family])


# The parameters outside the embeddings and the layers, by where they belong. ELECTRA's
# embeddings_project and DeBERTa's shared position table (and its LayerNorm) feed every layer:
# they had the head's lr (8x the embeddings' at 0.5 over 2 layers) and Freeze never froze them.
OUTSIDE = {
    "bert": {"head": ["bert.pooler.dense.weight", "classifier.weight"]},
    "roberta": {"head": ["classifier.dense.weight", "classifier.out_proj.weight"]},
    "electra": {"embeddings": ["electra.embeddings_project.weight"],
                "head": ["classifier.dense.weight", "classifier.out_proj.weight"]},
    "deberta-v2": {"embeddings": ["deberta.encoder.rel_embeddings.weight",
                                  "deberta.encoder.LayerNorm.weight"],
                   "head": ["pooler.dense.weight", "classifier.weight"]},
    "distilbert": {"head": ["pre_classifier.weight", "classifier.weight"]},
}


def test_a_head_declared_before_the_encoder_in_a_module_of_your_own_stays_the_head():
    """Everything before the encoder went with the embeddings: a head declared first got their
    lr, and Freeze froze it."""
    import torch

    class Mine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classifier = torch.nn.Linear(8, 2)
            self.embeddings = torch.nn.Embedding(10, 8)
            self.token_embeddings_scale = torch.nn.Linear(8, 8)  # named for embeddings
            self.encoder = torch.nn.Module()
            self.encoder.layer = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    model = Mine()
    lr_of = {id(p): group["lr"] for group in
             param_groups(model, 1.0, TrainConfig(layer_lr_decay=0.5)) for p in group["params"]}
    assert lr_of[id(model.classifier.weight)] == 1.0
    assert lr_of[id(model.token_embeddings_scale.weight)] == 0.125
    assert id(model.classifier.weight) not in {id(p) for p in encoder_layout(model).blocks()[0]}


@pytest.mark.parametrize("family", sorted(OUTSIDE))
def test_each_parameter_has_the_lr_of_the_block_it_feeds(family):
    model = tiny(family)
    names = {id(p): name for name, p in model.named_parameters()}
    lr_of = {names[id(p)]: group["lr"] for group in
             param_groups(model, 1e-3, TrainConfig(layer_lr_decay=0.5)) for p in group["params"]}
    assert len(lr_of) == len(names)  # every parameter in one group
    embeddings_lr = min(lr_of.values())
    assert embeddings_lr == pytest.approx(1e-3 * 0.5 ** 3)
    for where, expected in OUTSIDE[family].items():
        for name in expected:
            assert lr_of[name] == pytest.approx(embeddings_lr if where == "embeddings" else 1e-3), name
    blocks = encoder_layout(model).blocks()  # what Freeze freezes, bottom up
    in_blocks = {names[id(p)] for block in blocks for p in block}
    assert set(OUTSIDE[family].get("embeddings", [])) <= {names[id(p)] for p in blocks[0]}
    assert not set(OUTSIDE[family]["head"]) & in_blocks
