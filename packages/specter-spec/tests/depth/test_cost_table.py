"""CostTable: decaying means per count, their monotone fit and its piecewise-linear curve."""

import pytest

from specter_spec.depth.cost_table import CostTable, decayed


def test_decayed_starts_at_the_first_value_then_averages():
    assert decayed(None, 4.0, 0.9) == 4.0
    assert decayed(4.0, 14.0, 0.9) == pytest.approx(5.0)


def test_curve_joins_measured_counts_linearly_and_extends_the_end_slopes():
    table = CostTable(decay=0.5)
    table.add(2, 2.0, iteration=0)
    table.add(4, 3.0, iteration=0)
    table.tick(0, horizon=10)
    assert table.curve(6) == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0])


def test_a_count_measured_dearer_than_a_larger_one_is_pooled_into_a_monotone_fit():
    table = CostTable(decay=0.5)
    table.add(1, 1.0, iteration=0)
    table.add(2, 5.0, iteration=0)
    table.add(3, 3.0, iteration=0)
    table.tick(0, horizon=10)
    assert table.knots() == [(1, 1.0), (2, 4.0), (3, 4.0)]


def test_one_count_is_unknown_unless_the_table_is_proportional():
    plain, proportional = CostTable(decay=0.5), CostTable(decay=0.5, proportional=True)
    for table in (plain, proportional):
        table.add(2, 4.0, iteration=0)
    assert plain.curve(3) is None
    assert proportional.curve(3) == pytest.approx([0.0, 2.0, 4.0, 6.0])


def test_a_count_not_measured_within_the_horizon_is_forgotten():
    table = CostTable(decay=0.5)
    table.add(1, 1.0, iteration=0)
    table.add(2, 2.0, iteration=5)
    table.tick(6, horizon=6)
    assert table.means() == {2: 2.0}
    table.add(2, 4.0, iteration=6)  # one iteration later: the old one kept at weight 0.5
    assert table.means()[2] == pytest.approx((0.5 * 2.0 + 4.0) / 1.5)
