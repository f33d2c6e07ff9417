"""Cache statistics: totals add layers up (histograms bin by bin), rates are None until defined."""

from specter_cache import CacheStats


def test_totals_add_every_counter_and_histogram_bin_and_rates_follow():
    stats = CacheStats(2)
    a, b = stats.layers
    a.hits, a.misses, a.prefetch_used, a.prefetch_wasted, a.stall_seconds = 3, 1, 2, 2, 0.5
    b.hits, b.misses, b.prefetch_used, b.stall_seconds = 1, 3, 1, 0.25
    a.streamed_histogram.update({3: 1, 0: 2})
    b.streamed_histogram.update({3: 2, 1: 1})
    d = stats.as_dict()
    total = d["total"]
    assert (total["hits"], total["misses"], total["stall_seconds"]) == (4, 4, 0.75)
    assert total["streamed_histogram"] == {0: 2, 1: 1, 3: 3}
    assert list(total["streamed_histogram"]) == [0, 1, 3]  # bins in order
    assert total["hit_rate"] == 0.5
    assert total["prefetch_precision"] == 3 / 5
    assert total["prefetch_recall"] == 3 / 7
    assert [layer["hit_rate"] for layer in d["per_layer"]] == [0.75, 0.25]
    assert d["per_layer"][1]["prefetch_precision"] == 1.0  # used, none wasted


def test_rates_are_none_before_anything_happened_and_reset_zeroes_everything():
    stats = CacheStats(1)
    empty = stats.as_dict()["total"]
    assert empty["hit_rate"] is None
    assert empty["prefetch_precision"] is None
    assert empty["prefetch_recall"] is None
    stats.layers[0].hits = 2
    stats.layers[0].streamed_histogram[1] = 1
    stats.reset()
    assert stats.as_dict()["total"] == empty
