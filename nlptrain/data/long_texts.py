"""Texts far longer than the tokens kept of them, cut before the tokenizer sees them.

A fast tokenizer truncating to `max_length` tokens first tokenizes the whole text and keeps the
rest as overflow: a 20 MB cell (a stray quote that swallowed a file, a dumped page) took 2.9 GB
and 14 s for its first 128 tokens. A text longer than `max_length` x CHARS_PER_TOKEN characters
is cut at a space before that mark, and the cut is used only where it still holds `max_length`
tokens or more by itself: its tokens are then the whole text's first ones (a pre-tokenizer
splits at spaces, so every word before the cut is tokenized as in the whole text), and the
longer-first truncation of a pair takes the same tokens from either side. Else (a text of few
tokens in many characters, or no space near the mark) the text is tokenized whole, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CHARS_PER_TOKEN = 32  # English averages 4-6 characters a token: 32 leaves room for any prose
SPACES = (" ", "\n", "\t", "\r")


def without_unread_tails(texts: Sequence[str], tokenizer: Any, max_length: int) -> Sequence[str]:
    """`texts`, those far longer than `max_length` tokens cut where no kept token changes."""
    limit = max_length * CHARS_PER_TOKEN
    cuts: dict[int, str] = {}
    for i, text in enumerate(texts):
        if len(text) > limit:
            at = max(text.rfind(space, limit // 2, limit) for space in SPACES)
            if at > 0:
                cuts[i] = text[:at]
    if not cuts:
        return texts
    counted = tokenizer(list(cuts.values()), add_special_tokens=False, truncation=False,
                        return_attention_mask=False, return_token_type_ids=False,
                        verbose=False)["input_ids"]
    kept = list(texts)
    for (i, cut), ids in zip(cuts.items(), counted, strict=True):
        if len(ids) >= max_length:
            kept[i] = cut
    return kept
