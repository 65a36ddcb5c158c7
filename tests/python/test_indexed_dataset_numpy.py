"""Megaton's indexed datasets checked against an independent numpy restatement of Megatron-LM's layout
(megatron/core/datasets/indexed_dataset.py), both ways: `preprocess` output must parse, hold the input
bytes plus end-of-document (256) per document, and equal byte for byte what the numpy writer makes; and
datasets the numpy writer makes in every dtype code must read back in `megaton data inspect`.

Usage: /usr/bin/python3 tests/python/test_indexed_dataset_numpy.py --megaton PATH_TO_MEGATON
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from data_reference import CODES, megaton_json, read_dataset, run_tests, write_dataset

EOD = 256


def expected_tokens(text_bytes):
    return list(text_bytes) + [EOD]


def run_preprocess(megaton, inputs, prefix, *extra):
    cmd = [megaton, "preprocess", "--input", *inputs, "--output-prefix", prefix, "--tokenizer", "byte",
           "--append-eod", *extra]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
    assert Path(prefix + ".idx").exists(), f"{' '.join(cmd)} wrote no {prefix}.idx:\n{result.stdout}{result.stderr}"


def check_against_reference(prefix, texts):
    """The dataset holds one sequence per text, and matches the numpy writer byte for byte."""
    code, docs = read_dataset(prefix)
    assert code == 8, f"{prefix}: dtype code {code}, expected 8 (uint16) for the 257-token byte vocabulary"
    want = [[expected_tokens(t)] for t in texts]
    got = [[s.tolist() for s in doc] for doc in docs]
    assert got == want, f"{prefix}: tokens differ from the input bytes + EOD"
    reference = prefix + "_numpy"
    write_dataset(reference, want, 8)
    for ext in (".idx", ".bin"):
        assert Path(prefix + ext).read_bytes() == Path(reference + ext).read_bytes(), f"{prefix}{ext} != numpy writer"


def test_reference_round_trip(tmp):
    """The numpy writer and reader agree for every dtype code, so the checks below rest on something."""
    for code in CODES:
        docs = [[[1, 2, 3], [4]], [[5, 6, 7, 8]], [[]]]
        prefix = str(tmp / f"ref{code}")
        write_dataset(prefix, docs, code)
        got_code, got = read_dataset(prefix)
        assert got_code == code
        assert [[s.tolist() for s in d] for d in got] == docs, f"code {code}"


def test_jsonl(megaton, tmp):
    texts = ["hello world", "caf\u00e9 \u2603 \"quoted\"\nsecond line", "x" * 5000, "last"]
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t, "meta": i}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    prefix = str(tmp / "jsonl")
    run_preprocess(megaton, [str(corpus)], prefix, "--workers", "2")
    check_against_reference(prefix, [t.encode("utf-8") for t in texts])


def test_json_key_and_text_separator(megaton, tmp):
    corpus = tmp / "c.jsonl"
    corpus.write_text(json.dumps({"text": "ignored", "body": "chosen"}) + "\n", encoding="utf-8")
    prefix = str(tmp / "key")
    run_preprocess(megaton, [str(corpus)], prefix, "--json-key", "body")
    check_against_reference(prefix, [b"chosen"])

    fortunes = tmp / "fortunes"
    raw = b"First fortune,\n  two lines.\n%\nSecond \xff\xfe not UTF-8.\n%\nThird.\n%\n"
    fortunes.write_bytes(raw)
    prefix = str(tmp / "fortunes")
    run_preprocess(megaton, [str(fortunes)], prefix, "--doc-separator", "%")
    check_against_reference(prefix, [b"First fortune,\n  two lines.\n", b"Second \xff\xfe not UTF-8.\n", b"Third.\n"])


def test_numpy_written_every_dtype(megaton, tmp):
    """Every dtype code, with values at the edges of each type, several sequences per document and an
    empty one, reads back in megaton exactly: counts, lengths, tokens and the token histogram."""
    edges = {1: [0, 255], 2: [-128, 127], 3: [-32768, 32767], 4: [-2**31, 2**31 - 1], 5: [-2**62, 2**62],
             6: [-2**52, 2**52], 7: [-2**24, 2**24], 8: [0, 65535]}
    for code, (lo, hi) in edges.items():
        docs = [[[lo, 1, 2, 2], [hi, 2]], [[]], [[7, 7, 7, 2, hi]], [[1], [2], [lo]]]
        prefix = str(tmp / f"numpy{code}")
        write_dataset(prefix, docs, code)
        got = megaton_json(megaton, "data", "inspect", prefix, "--json", "--show", len(docs))
        seqs = [s for d in docs for s in d]
        tokens = [t for s in seqs for t in s]
        assert got["dtype"] == code, f"code {code}: megaton says dtype {got['dtype']}"
        assert (got["documents"], got["sequences"], got["tokens"]) == (len(docs), len(seqs), len(tokens)), \
            f"code {code}: counts {got}"
        assert (got["min_length"], got["max_length"]) == (0, 5), f"code {code}: lengths {got}"
        assert (got["min_token"], got["max_token"]) == (lo, hi), f"code {code}: token range {got}"
        shown = [d["tokens"] for d in got["documents_shown"]]
        assert shown == [[t for s in d for t in s] for d in docs], f"code {code}: tokens {shown}"
        values, counts = np.unique(np.array(tokens, dtype=np.int64), return_counts=True)
        order = sorted(zip(values.tolist(), counts.tolist()), key=lambda vc: (-vc[1], vc[0]))
        assert got["distinct_tokens"] == len(order), f"code {code}: distinct {got['distinct_tokens']}"
        assert [tuple(p) for p in got["top_tokens"]] == order[:10], f"code {code}: histogram {got['top_tokens']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    args = parser.parse_args()
    tests = [("reference_round_trip", test_reference_round_trip),
             ("jsonl", lambda tmp: test_jsonl(args.megaton, tmp)),
             ("json_key_and_text_separator", lambda tmp: test_json_key_and_text_separator(args.megaton, tmp)),
             ("numpy_written_every_dtype", lambda tmp: test_numpy_written_every_dtype(args.megaton, tmp))]
    return run_tests(tests, "megaton_idx_")


if __name__ == "__main__":
    sys.exit(main())
