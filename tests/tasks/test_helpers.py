"""grpo.tasks' shared helpers: the clustered standard error of an evaluation's accuracy."""

from __future__ import annotations

import math
import statistics

import pytest

from grpo.tasks import clustered_standard_error


def test_one_value_a_cluster_is_the_usual_standard_error():
    """With every cluster a single value it equals s / sqrt(n), s over n - 1."""
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    expected = statistics.stdev(values) / math.sqrt(len(values))
    assert clustered_standard_error(values, list(range(7))) == pytest.approx(expected, rel=1e-12)


def test_repeated_equal_items_count_as_one():
    """Ten copies of each of four items give the standard error of the four items' mean (the
    copies add no information), not one sqrt(10) times smaller."""
    items = [1.0, 0.0, 1.0, 1.0]
    four = clustered_standard_error(items, [0, 1, 2, 3])
    copies = clustered_standard_error([v for v in items for _ in range(10)],
                                      [c for c in range(4) for _ in range(10)])  # fmt: skip
    assert copies == pytest.approx(four, rel=1e-12)
    naive = statistics.stdev([v for v in items for _ in range(10)]) / math.sqrt(40)
    assert copies > 1.5 * naive


def test_hand_computed_value_and_refusals():
    """[1, 0 | 1] by hand: mean 2/3, cluster sums -1/3 and 1/3, variance 2 * (2/9) / 9."""
    assert clustered_standard_error([1.0, 0.0, 1.0], ["a", "a", "b"]) == pytest.approx(2 / 9)
    assert math.isnan(clustered_standard_error([1.0, 0.0], ["a", "a"]))
    with pytest.raises(ValueError, match="differ in length"):
        clustered_standard_error([1.0], ["a", "b"])
