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
same tokens; under an odd one the cuts must keep the whole sides' order: where they would not,
the whole sides are counted piece by piece and the side that must be the longer is cut longer.
A text of few tokens in many characters, one without a space near the mark, or a tokenizer
keeping the text's end, is tokenized whole, as before.
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
    candidates = {(side, row): cut for side, column in enumerate(kept) for row, text in
                  enumerate(column or ()) if len(text) > limit and (cut := _cut(text, limit))}
    if not candidates:
        return kept
    lengths = dict(zip(candidates, _counts(tokenizer, list(candidates.values())), strict=True))
    cuts = {key: cut for key, cut in candidates.items() if lengths[key] >= max_length + MARGIN}
    if pairs is None:
        for (_, row), cut in cuts.items():
            kept[0][row] = cut
        return kept
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=True)
    for row in sorted({row for _, row in cuts}):
        whole = (kept[0][row], kept[1][row])
        sides = [(cuts[side, row], lengths[side, row]) if (side, row) in cuts else None
                 for side in (0, 1)]
        kept[0][row], kept[1][row] = _cut_pair(whole, sides, tokenizer, limit, budget)
    return kept


def _cut_pair(whole: tuple[str, str], sides: list[tuple[str, int] | None], tokenizer: Any,
              limit: int, budget: int) -> tuple[str, str]:
    """A pair with one side or both cut (`sides`: each side's cut and its tokens, or None), where
    the truncation keeps the same tokens of it; else the pair whole."""
    cut = [side[0] if side else text for side, text in zip(sides, whole, strict=True)]
    if budget % 2 == 0:  # each side keeps what the shorter's length says, a cut one being over it
        return cut[0], cut[1]
    count = [side[1] if side else -1 for side in sides]
    for i, side in enumerate(sides):
        if side is None:
            count[i] = _counts(tokenizer, [whole[i]])[0]
    # Which side the cuts make the longer (the second on a tie) holds for the whole sides where
    # only the first was cut and still is the longer, or only the second and still is not shorter.
    if sides[1] is None and count[0] > count[1] or sides[0] is None and count[1] >= count[0]:
        return cut[0], cut[1]
    totals = [_whole_count(tokenizer, text, limit) if side else n
              for side, text, n in zip(sides, whole, count, strict=True)]
    if None in totals:
        return whole
    longer = 1 if totals[1] >= totals[0] else 0
    if (count[1] >= count[0]) == (longer == 1):
        return cut[0], cut[1]
    text, mark = whole[longer], 2 * limit  # cut the side that must be the longer, longer
    while mark < len(text) and (further := _cut(text, mark)):
        tokens = _counts(tokenizer, [further])[0]
        if tokens > count[1 - longer] or longer == 1 and tokens == count[0]:
            cut[longer] = further
            return cut[0], cut[1]
        mark *= 2
    cut[longer] = text
    return cut[0], cut[1]


def _whole_count(tokenizer: Any, text: str, limit: int) -> int | None:
    """`text`'s tokens, counted in pieces of at most `limit` characters, each ended where a run
    of spaces begins (memory that does not grow with the text); None without such a space."""
    pieces, start = [], 0
    while len(text) - start > limit:
        piece = _cut(text[start:start + limit], limit)
        if not piece.strip():
            return None
        pieces.append(piece)
        start += len(piece)
    return sum(_counts(tokenizer, [*pieces, text[start:]]))


def _counts(tokenizer: Any, texts: list[str]) -> list[int]:
    found = tokenizer(texts, add_special_tokens=False, truncation=False,
                      return_attention_mask=False, return_token_type_ids=False, verbose=False)
    return [len(ids) for ids in found["input_ids"]]


def _cut(text: str, limit: int) -> str:
    """`text` up to the run of spaces last begun before `limit` (from `limit // 2` on), or ""."""
    at = max(text.rfind(space, limit // 2, limit) for space in SPACES)
    return text[:at].rstrip() if at > 0 else ""
