"""Megaton's GPTDataset sampling indices checked against a Python restatement of Megatron-LM's algorithm
(megatron/core/datasets/gpt_dataset.py, helpers.cpp build_sample_idx, blended_megatron_dataset_config.py
split parsing; in data_reference.py, shared with the end-to-end checks) using numpy's own RandomState:
the document, sample and shuffle indices megaton caches as .npy files must equal the reference exactly,
for one epoch, several epochs with the short last epoch shuffled separately, and several epochs
without; the samples megaton reads must be the reference's token windows; and the cache must be reused
when nothing changed and rebuilt when the data changed.

Usage: /usr/bin/python3 tests/python/test_gpt_dataset_reference.py --megaton PATH_TO_MEGATON
"""
import argparse
import sys

import numpy as np

from data_reference import megaton_json, megatron_indices, megatron_sample, run_tests, split_ranges, write_dataset


# --- checks -----------------------------------------------------------------------------------------

def write_fixture(prefix, num_docs, seed):
    """Random sequence lengths (some empty), token t of sequence s = s * 100 + t % 100 (int32)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, size=num_docs)
    lengths[[2, num_docs // 2]] = 0
    sequences = [np.array([s * 100 + t % 100 for t in range(n)], dtype=np.int64) for s, n in enumerate(lengths)]
    write_dataset(prefix, [[s.tolist()] for s in sequences], 4)
    return lengths.astype(np.int32), sequences


def inspect(megaton, prefix, cache, seq_length, seed, split, samples):
    args = ["data", "inspect", prefix, "--json", "--show", 4, "--seq-length", seq_length, "--seed", seed,
            "--split", split, "--data-cache-path", cache]
    for name, n in zip(("train", "valid", "test"), samples):
        if n is not None:
            args += [f"--{name}-samples", n]
    return megaton_json(megaton, *args)["splits"]


def check_split(got, sizes, sequences, documents, num_samples, seq_length, seed, label):
    """Compares one split; returns whether its last epoch was shuffled separately (None: empty split)."""
    if np.sum(sizes[documents]) == 0:
        # Megatron's build_sample_idx asserts on a split without tokens; megaton gives an empty dataset.
        assert got["samples"] == 0, f"{label}: a split without tokens has {got['samples']} samples"
        return None
    doc, sample, shuffle, separate = megatron_indices(sizes, documents, num_samples, seq_length, seed)
    base = got["cache_path"]
    got_doc = np.load(base + "-document_index.npy")
    got_sample = np.load(base + "-sample_index.npy")
    got_shuffle = np.load(base + "-shuffle_index.npy")
    assert got["separate_final_epoch"] == separate, f"{label}: separate_final_epoch {got['separate_final_epoch']}"
    assert np.array_equal(got_doc, doc), f"{label}: document index differs\n{got_doc[:20]}\n{doc[:20]}"
    assert np.array_equal(got_sample, sample), f"{label}: sample index differs"
    assert np.array_equal(got_shuffle, shuffle.astype(np.int64)), f"{label}: shuffle index differs"
    assert got["samples"] == len(shuffle), f"{label}: {got['samples']} samples, reference {len(shuffle)}"
    for i, shown in enumerate(got["samples_shown"]):
        want = megatron_sample(sequences, doc, sample, shuffle, i)
        assert shown["tokens"] == want, f"{label}: sample {i} tokens {shown['tokens']} != {want}"
    return separate


def test_indices_equal_megatron(megaton, tmp):
    prefix, cache = str(tmp / "fixture"), str(tmp / "cache")
    sizes, sequences = write_fixture(prefix, 200, 1)
    seen_separate = set()
    # (seq_length, seed, split, samples per split): one epoch everywhere; then train over three epochs with
    # the last one just under 80% of an epoch (shuffled separately) and exactly at it (not), and a short
    # last epoch with a 1-token sequence length.
    tokens = int(np.sum(sizes[slice(*split_ranges("90,8,2", len(sizes))[0])]))
    per_epoch, two_epochs = (tokens - 1) // 16, (2 * tokens - 1) // 16
    cases = [(16, 1234, "969,30,1", (None, None, None)),
             (16, 7, "90,8,2", (two_epochs + int(0.8 * per_epoch) - 1, 400, 50)),
             (16, 2**32 - 1, "90,8,2", (two_epochs + int(0.8 * per_epoch), None, 1)),
             (1, 0, "1", (3000, None, None))]
    for seq_length, seed, split, samples in cases:
        got = inspect(megaton, prefix, cache, seq_length, seed, split, samples)
        ranges = split_ranges(split, len(sizes))
        for name, rng_docs, n in zip(("train", "valid", "test"), ranges, samples):
            assert (name in got) == (rng_docs is not None), f"{split}: split {name} presence"
            if rng_docs is None:
                continue
            documents = np.arange(rng_docs[0], rng_docs[1], dtype=np.int32)
            label = f"T={seq_length} seed={seed} split={split} {name} samples={n}"
            seen_separate.add(check_split(got[name], sizes, sequences, documents, n, seq_length, seed, label))
    assert {True, False} <= seen_separate, f"the cases must cover both last-epoch rules, saw {seen_separate}"


def test_cache_reused_and_rebuilt(megaton, tmp):
    prefix, cache = str(tmp / "cached"), str(tmp / "cache2")
    write_fixture(prefix, 100, 2)
    first = inspect(megaton, prefix, cache, 8, 3, "98,2", (500, 20, None))
    assert first["train"]["built"] and first["valid"]["built"], "first run must build"
    again = inspect(megaton, prefix, cache, 8, 3, "98,2", (500, 20, None))
    assert not again["train"]["built"] and not again["valid"]["built"], "unchanged inputs must load the cache"
    assert again["train"]["samples_shown"] == first["train"]["samples_shown"]

    sizes, sequences = write_fixture(prefix, 100, 3)  # new data, other lengths
    changed = inspect(megaton, prefix, cache, 8, 3, "98,2", (500, 20, None))
    assert changed["train"]["built"], "changed data must rebuild the indices"
    assert changed["train"]["cache_path"] != first["train"]["cache_path"]
    check_split(changed["train"], sizes, sequences, np.arange(0, 98, dtype=np.int32), 500, 8, 3, "rebuilt")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    args = parser.parse_args()
    tests = [("indices_equal_megatron", lambda tmp: test_indices_equal_megatron(args.megaton, tmp)),
             ("cache_reused_and_rebuilt", lambda tmp: test_cache_reused_and_rebuilt(args.megaton, tmp))]
    return run_tests(tests, "megaton_gpt_")


if __name__ == "__main__":
    sys.exit(main())
