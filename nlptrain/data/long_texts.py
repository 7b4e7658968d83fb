"""Texts far longer than the tokens kept of them, cut before the tokenizer sees them.

A fast tokenizer truncating to `max_length` tokens first tokenizes the whole text and keeps the
rest as overflow (of a pair: every pair of its sides' pieces): an 18 MB cell took 3 GB and 19 s
for its first 128 tokens. A text longer than `max_length` x CHARS_PER_TOKEN characters is cut
at the start of a run of spaces before that mark, and the cut is used only where it still holds
`max_length` + MARGIN tokens by itself: the pre-tokenizer splits at spaces, so every word before
the cut is tokenized as in the whole text, and the tokens kept are the whole text's.

A pair's longest-first truncation keeps, of each side, a count that depends only on which side
is shorter and on that side's length (the tokenizer's `truncate_encodings`). With a side cut
the shorter one stays the shorter, hence a cut is kept where the other side is shorter than the
cut side, or where both sides stay over the budget and the budget is even (each keeps half).
Anything else (a text of few tokens in many characters, no space near the mark, two long sides
under an odd budget, a tokenizer keeping the text's end) is tokenized whole, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CHARS_PER_TOKEN = 32  # English averages 4-6 characters a token: 32 leaves room for any prose
MARGIN = 8  # tokens past max_length a cut must hold: room for a boundary's odd tokenization
SPACES = (" ", "\n", "\t", "\r")


def without_unread_tails(texts: Sequence[str], pairs: Sequence[str] | None, tokenizer: Any,
                         max_length: int | None) -> tuple[list[str], list[str] | None]:
    """`texts` and `pairs`, where cutting a text far longer than `max_length` tokens changes
    no token the tokenizer keeps of the row, cut."""
    kept = list(texts), None if pairs is None else list(pairs)
    if not max_length or getattr(tokenizer, "truncation_side", "right") != "right":
        return kept
    limit = max_length * CHARS_PER_TOKEN
    cuts = {(side, row): cut for side, column in enumerate(kept) for row, text in
            enumerate(column or ()) if len(text) > limit and (cut := _cut(text, limit))}
    if not cuts:
        return kept
    # Counted without truncation, each cut a few thousand characters; so is a pair's other
    # side where it was not cut (its length decides which side is the shorter).
    others = {(1 - side, row) for side, row in cuts if pairs is not None} - cuts.keys()
    counted = {**cuts, **{(side, row): kept[side][row] for side, row in others}}
    found = tokenizer(list(counted.values()), add_special_tokens=False, truncation=False,
                      return_attention_mask=False, return_token_type_ids=False, verbose=False)
    length = dict(zip(counted, map(len, found["input_ids"]), strict=True))
    budget = max_length - (0 if pairs is None else tokenizer.num_special_tokens_to_add(pair=True))
    for (side, row), cut in cuts.items():
        if length[side, row] < max_length + MARGIN:
            continue
        other = (1 - side, row)
        if pairs is None:
            safe = True
        elif other in cuts:  # its whole holds at least its cut's tokens
            safe = budget % 2 == 0 and length[other] > budget  # both over: each keeps half
        else:
            safe = length[other] < length[side, row] or budget % 2 == 0 and length[other] > budget
        if safe:
            kept[side][row] = cut
    return kept


def _cut(text: str, limit: int) -> str:
    """`text` up to the run of spaces last begun before `limit` (from `limit // 2` on), or ""."""
    at = max(text.rfind(space, limit // 2, limit) for space in SPACES)
    return text[:at].rstrip() if at > 0 else ""
