"""Texts far longer than the tokens kept of them, cut before the tokenizer sees them.

A fast tokenizer truncating to `max_length` tokens first tokenizes the whole text and keeps the
rest as overflow (of a pair: every pair of its sides' pieces): an 18 MB cell took 3 GB and 19 s
for its first 128 tokens. A text longer than `max_length` x CHARS_PER_TOKEN characters is cut
where a run of spaces begins before that mark, and the cut is used only where it still holds
`max_length` + MARGIN tokens by itself: the pre-tokenizer splits at spaces, so every word before
the cut is tokenized as in the whole text, and the tokens kept are the whole text's.

A pair's longest-first truncation (the tokenizer's `truncate_encodings`) keeps of each side what
the shorter side's length says, the odd token of an odd budget going to the longer side (the
second on a tie). A cut side stays over the budget, so under an even budget any cut keeps the
same tokens; under an odd one a side is cut only where the other side, whole, stays on the
same side of it (shorter than a cut first side, not longer than a cut second one). Two long
sides under an odd budget (BERT's pairs at an even max_length) are tokenized whole, as is a
text of few tokens in many characters, one without a space near the mark, and every text of a
tokenizer that keeps a text's end.
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
    odd = pairs is not None and (max_length - tokenizer.num_special_tokens_to_add(pair=True)) % 2
    # Counted without truncation: the cuts, and under an odd budget a cut pair side's other
    # side, which is short (or has no space to cut it at: counted whole once, not once for each
    # piece of the other).
    others = {(1 - side, row) for side, row in cuts if odd} - cuts.keys()
    counted = {**cuts, **{(side, row): kept[side][row] for side, row in others}}
    found = tokenizer(list(counted.values()), add_special_tokens=False, truncation=False,
                      return_attention_mask=False, return_token_type_ids=False, verbose=False)
    length = dict(zip(counted, map(len, found["input_ids"]), strict=True))
    for (side, row), cut in cuts.items():
        other = (1 - side, row)
        if length[side, row] < max_length + MARGIN:
            continue
        if odd and (other in cuts or (length[other] >= length[side, row] if side == 0
                                      else length[other] > length[side, row])):
            continue  # which side is the longer could change: the odd token would move
        kept[side][row] = cut
    return kept


def _cut(text: str, limit: int) -> str:
    """`text` up to the run of spaces last begun before `limit` (from `limit // 2` on), or ""."""
    at = max(text.rfind(space, limit // 2, limit) for space in SPACES)
    return text[:at].rstrip("".join(SPACES)) if at > 0 else ""
