"""Self-tests of data_reference.py's restatement of Megatron's data pipeline where megaton is not needed to
judge it: split ranges, BlendedDataset order and sizes against values worked out by hand.

Usage (CTest runs it): /usr/bin/python3 tests/python/selftest_data_reference.py
"""
import sys

from data_reference import blend_sizes, blending_indices, run_tests, split_ranges


def test_split_ranges_by_hand(tmp):
    assert split_ranges("90,10,0", 60) == [(0, 54), (54, 60), None]
    assert split_ranges("969,30,1", 1000) == [(0, 969), (969, 999), (999, 1000)]


def test_blending_order_by_hand(tmp):
    # Weights 0.6 / 0.4: sample i goes to the dataset furthest below w * max(i, 1). At i = 5 both are
    # exactly on target (0.6 * 5 and 0.4 * 5 round to 3.0 and 2.0 in double) and the tie goes to the first.
    dataset, sample = blending_indices([0.6, 0.4], 10)
    assert dataset.tolist() == [0, 1, 0, 1, 0, 0, 1, 0, 1, 0], dataset
    assert sample.tolist() == [0, 0, 1, 1, 2, 3, 2, 4, 3, 5], sample


def test_blend_sizes_by_hand(tmp):
    # 20 samples at 3:2 draw 12 and 8; each dataset is built 0.5% larger, rounded up.
    weights, drawn, built = blend_sizes([3, 2], 20)
    assert weights.tolist() == [0.6, 0.4] and drawn == [12, 8] and built == [13, 9], (weights, drawn, built)


def main():
    tests = [(name.removeprefix("test_"), fn) for name, fn in globals().items() if name.startswith("test_")]
    return run_tests(tests, "data_reference_selftest_")


if __name__ == "__main__":
    sys.exit(main())
