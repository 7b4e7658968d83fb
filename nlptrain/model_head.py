"""A saved classifier's head, fitted to the labels it is trained on now.

transformers gives a model a new head only where the saved one has another number of outputs.
A classifier fine-tuned for the same number of labels kept its head row for row, whatever the
labels now are: its row 0 went on meaning its own label 0 (labels read from the data are sorted,
so another data set's order swaps them), and a model that said "pos" was exported as "neg".
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where used: --help imports none of it
    import torch

log = logging.getLogger(__name__)
DEFAULT_NAME = re.compile(r"LABEL_\d+")  # transformers' names where a config was given none


def fit_head_to_labels(model: Any, saved_names: Sequence[str], names: Sequence[str],
                       says: bool = True, missing: Collection[str] = ()) -> None:
    """The head's rows of `model` (loaded over a classifier whose outputs were `saved_names`)
    put in the order of `names` where both name the same labels; a new head where they name
    others. Saved names that are transformers' defaults (LABEL_0, ...) tell nothing: the head
    is kept as it is. `missing`: the parameters the saved model lacked (transformers' loading
    info): a head whose every row-a-label parameter is among them is new already, whatever the
    names (an encoder saved alone keeps its classifier's config). `says`: the rank that logs what was done."""
    saved, names = list(saved_names), list(names)
    if saved == names or len(saved) != len(names) or len(names) < 2 \
            or all(DEFAULT_NAME.fullmatch(str(name)) for name in saved):
        return
    rows = head_rows(model)
    if not rows or set(rows) <= set(missing):  # (a head transformers does not build with one row
        return  # a label is left as it is; a head partly saved has its saved rows reordered)
    import torch

    say = log.info if says else log.debug
    if sorted(saved) == sorted(names):
        order = torch.tensor([saved.index(name) for name in names])
        with torch.no_grad():
            for param in rows.values():
                param.copy_(param[order])
        say("the model's classifier head, trained for labels %s, is reordered to %s", saved, names)
        return
    init = getattr(model, "_init_weights", None)  # transformers' own start for a new head
    owners = {name.rpartition(".")[0] for name in rows}
    for name, module in model.named_modules():
        if name in owners and init is not None:
            for param in module.parameters(recurse=False):  # loaded: its init would skip them
                param._is_hf_initialized = False
            init(module)
    (log.warning if says else log.debug)(
        "the model's classifier head was trained for labels %s, not %s: a new head is trained "
        "(keep the model's label names, in [data] labels, to train on from its head)", saved, names)


def head_rows(model: Any) -> dict[str, torch.nn.Parameter]:
    """The parameters of `model` with a row a label: those that a model built with one more
    label has of another shape (built on the meta device: no memory, no weights)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(model.config)
    config.num_labels = model.config.num_labels + 1
    try:
        with torch.device("meta"):
            wider = AutoModelForSequenceClassification.from_config(config)
    except (ValueError, TypeError, KeyError):  # (a class transformers cannot build from its config)
        return {}
    shapes = {name: param.shape for name, param in wider.named_parameters()}
    return {name: param for name, param in model.named_parameters()
            if name in shapes and shapes[name] != param.shape}
