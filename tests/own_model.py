"""A user's own model for the tests: `BertModel` and a head of its own, not a transformers
classifier; it returns plain logits, and the trainer is told the labels and the kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from conftest import write_toy_tsv
from torch import nn

from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset, read_examples


class MeanPoolClassifier(nn.Module):
    """Mean of the encoder's token states (padding left out), a dropout, one linear layer."""

    def __init__(self, encoder_dir: Path, num_labels: int) -> None:
        from transformers import BertModel

        super().__init__()
        self.encoder = BertModel.from_pretrained(str(encoder_dir), add_pooling_layer=False)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(self.encoder.config.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(self.dropout(pooled))


def positive_rate(predictions) -> dict[str, float]:
    """A user's own metric on the gathered predictions: the share of rows predicted 'pos'."""
    return {"positive_rate": float((predictions.outputs.argmax(1) == 1).mean())}


def toy_sets(folder: Path, tokenizer) -> tuple[TokenizedDataset, TokenizedDataset]:
    vocab = LabelVocab.from_config(["neg", "pos"])
    sets = []
    for name, rows, seed in (("train", 64, 1), ("test", 40, 2)):
        write_toy_tsv(folder / f"{name}.tsv", rows, seed)
        examples = read_examples(FileSpec(path=f"{name}.tsv"), folder, [])
        sets.append(TokenizedDataset.from_texts(examples.texts, vocab.encode(examples), tokenizer, 32))
    return sets[0], sets[1]


def expected_rate(model: nn.Module, data: TokenizedDataset) -> float:
    """positive_rate computed by hand, one row at a time."""
    model.eval()
    with torch.no_grad():
        guesses = [int(model(torch.as_tensor(np.asarray(data[i]["input_ids"]), dtype=torch.long)[None],
                             torch.ones(1, len(data[i]["input_ids"]), dtype=torch.long)).argmax())
                   for i in range(len(data))]
    return float(np.mean(np.asarray(guesses) == 1))
