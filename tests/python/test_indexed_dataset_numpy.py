"""Megaton's `preprocess` output checked against an independent numpy restatement of Megatron-LM's
indexed dataset layout (megatron/core/datasets/indexed_dataset.py): the files must parse, hold the input
bytes plus end-of-document (256) per document, and equal byte for byte what the numpy writer makes.

Usage: /usr/bin/python3 tests/python/test_indexed_dataset_numpy.py --megaton PATH_TO_MEGATON
"""
import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
         8: np.uint16}
EOD = 256


def write_dataset(prefix, documents, code):
    """documents: list of documents, each a list of sequences (lists of ints)."""
    dtype = np.dtype(CODES[code]).newbyteorder("<")
    sequences = [np.asarray(s, dtype=dtype) for doc in documents for s in doc]
    lengths = np.array([len(s) for s in sequences], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype("<i8") * dtype.itemsize)[:-1]]).astype("<i8") \
        if sequences else np.zeros(0, dtype="<i8")
    doc_index = np.cumsum([0] + [len(doc) for doc in documents]).astype("<i8")
    Path(prefix + ".bin").write_bytes(b"".join(s.tobytes() for s in sequences))
    header = MAGIC + struct.pack("<QBQQ", 1, code, len(sequences), len(doc_index))
    Path(prefix + ".idx").write_bytes(header + lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())


def read_dataset(prefix):
    """Returns (dtype code, documents as lists of sequences as numpy arrays)."""
    idx = Path(prefix + ".idx").read_bytes()
    assert idx[:9] == MAGIC, f"{prefix}.idx: bad magic {idx[:9]!r}"
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1, f"{prefix}.idx: version {version}"
    assert code in CODES, f"{prefix}.idx: unknown dtype code {code}"
    offset = 34
    assert len(idx) == offset + 12 * n_seq + 8 * n_doc, f"{prefix}.idx: size {len(idx)} disagrees with header"
    lengths = np.frombuffer(idx, dtype="<i4", count=n_seq, offset=offset)
    pointers = np.frombuffer(idx, dtype="<i8", count=n_seq, offset=offset + 4 * n_seq)
    doc_index = np.frombuffer(idx, dtype="<i8", count=n_doc, offset=offset + 12 * n_seq)
    assert doc_index[0] == 0 and doc_index[-1] == n_seq, f"{prefix}.idx: document index {doc_index}"
    data = Path(prefix + ".bin").read_bytes()
    dtype = np.dtype(CODES[code]).newbyteorder("<")
    sequences = [np.frombuffer(data, dtype=dtype, count=int(n), offset=int(p)) for n, p in zip(lengths, pointers)]
    return code, [sequences[doc_index[d]:doc_index[d + 1]] for d in range(n_doc - 1)]


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    args = parser.parse_args()
    tests = [("reference_round_trip", test_reference_round_trip),
             ("jsonl", lambda tmp: test_jsonl(args.megaton, tmp)),
             ("json_key_and_text_separator", lambda tmp: test_json_key_and_text_separator(args.megaton, tmp))]
    failures = 0
    with tempfile.TemporaryDirectory(prefix="megaton_idx_") as tmp_dir:
        for name, test in tests:
            try:
                test(Path(tmp_dir))
                print(f"ok: {name}")
            except (AssertionError, OSError) as e:
                failures += 1
                print(f"FAIL: {name}: {e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
