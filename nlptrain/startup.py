"""Start-up of the commands that load a model (`train`, `eval`, `predict`).

Importing torch, nlptrain's training modules and transformers' model code makes about 600,000
Python objects that live as long as the process. Python's cyclic collector runs a full
collection each time the objects grow by a quarter: six during these imports, each walking all
of them, and every later full collection walks them again (~0.2 s each on the development
machine; the imports took 2.9 s with the collector on and 2.2 s with it paused). So the imports
run with the collector paused, and what they made is then frozen: `gc.freeze()` moves it out of
the collector's sight for good. A forked data-loader worker gains too: the collector no longer
writes to those objects' headers, so their pages stay shared with the parent.

Library users calling `nlptrain` from Python keep their interpreter's collector as it was; only
the command line does this, once a process, before anything else imports torch.
"""

from __future__ import annotations

import functools
import gc
import importlib

# What every model-loading command imports anyway (the model's own module, e.g. modeling_bert,
# is small and comes later with its config).
LIBRARIES = ("torch", "nlptrain.recipe", "transformers.modeling_utils",
             "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto")


@functools.cache  # once a process: what is frozen is never collected
def import_libraries() -> None:
    """Import LIBRARIES with the collector paused, then freeze every object alive and turn the
    collector back on (as it was: a caller that had turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.collect()  # cheap before the imports (~25,000 objects): no garbage already made is frozen
    gc.disable()
    try:
        for name in LIBRARIES:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
