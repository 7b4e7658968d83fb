"""LabelOrder: rows grouped by label (class by class in file order) are told from a random order."""

from __future__ import annotations

import random

import numpy as np

from nlptrain.data.label_order import LabelOrder, label_key
from nlptrain.kinds import MultiLabel, Regression, SingleLabel


def shuffled(labels: list, seed: int = 0) -> list:
    labels = list(labels)
    random.Random(seed).shuffle(labels)
    return labels


def test_rows_one_label_after_another_are_grouped_and_a_shuffle_of_them_is_not():
    grouped = ["neg"] * 300 + ["pos"] * 300
    order = LabelOrder.of(grouped)
    assert (order.rows, order.changes, round(order.expected)) == (600, 1, 300)
    assert order.grouped
    assert str(order) == "1 label change in 600 rows; a shuffled order has ~300"
    assert not LabelOrder.of(shuffled(grouped)).grouped
    # A TSV sorted by label with three classes, uneven; and runs of ten rows (still grouped).
    assert LabelOrder.of(sorted(["a"] * 500 + ["b"] * 80 + ["c"] * 20)).grouped
    assert LabelOrder.of([label for run in range(60) for label in [run % 2] * 10]).grouped
    # Rare labels and imbalanced shuffles never look grouped.
    for seed in range(20):
        assert not LabelOrder.of(shuffled(["a"] * 950 + ["b"] * 50, seed)).grouped
        assert not LabelOrder.of(shuffled(["a"] * 400 + ["b"] * 300 + ["c"] * 300, seed)).grouped


def test_small_files_and_one_label_files_are_never_grouped():
    assert not LabelOrder.of(["neg"] * 40 + ["pos"] * 40).grouped  # too few rows to warn
    assert not LabelOrder.of(["neg"] * 1000).grouped                # one label: nothing to interleave
    assert not LabelOrder.of([]).grouped
    assert LabelOrder.of([]).expected == 0


def test_multi_label_rows_are_compared_by_their_label_sets_and_regression_is_not_checked():
    multi = MultiLabel()
    cells = ["joy"] * 200 + ["anger,joy"] * 200 + [""] * 200
    keys = [label_key(cell, multi) for cell in cells]
    assert label_key("joy, anger", multi) == label_key(["anger", "joy"], multi) == ("anger", "joy")
    assert LabelOrder.of(keys).grouped and not LabelOrder.of(shuffled(keys)).grouped
    assert label_key("pos", SingleLabel()) == ("pos",)
    scores = sorted(str(s % 5) for s in range(1000))  # sorted scores: no classes, no verdict
    assert not LabelOrder.of(label_key(s, Regression()) for s in scores).grouped


def test_encoded_targets_give_the_same_counts_as_the_labels():
    ids = np.array([0] * 150 + [1] * 100 + [2] * 50)
    for targets in (ids, np.array(shuffled(ids.tolist()))):
        by_targets, by_labels = LabelOrder.of_targets(targets), LabelOrder.of(targets.tolist())
        assert (by_targets.changes, by_targets.expected, by_targets.grouped) == \
            (by_labels.changes, by_labels.expected, by_labels.grouped)
    multi_hot = np.array([[1, 0]] * 120 + [[1, 1]] * 120 + [[0, 0]] * 120, dtype=np.float32)
    order = LabelOrder.of_targets(multi_hot)
    assert order.changes == 2 and order.grouped
    assert not LabelOrder.of_targets(multi_hot[np.random.default_rng(0).permutation(360)]).grouped
