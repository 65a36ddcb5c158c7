"""Shared pieces of the data pipeline's Python checks: an independent numpy restatement of Megatron-LM's
indexed dataset layout (megatron/core/datasets/indexed_dataset.py: PREFIX.idx holds magic, version, dtype
code, counts, sequence lengths, byte pointers and document indices; PREFIX.bin the tokens), running the
megaton CLI for its JSON output, and a minimal test runner.
"""
import json
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
         8: np.uint16}


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


def megaton_json(megaton, *args):
    """Runs `megaton ARGS` and returns its JSON output (the last stdout line); fails naming the command."""
    cmd = [str(megaton), *map(str, args)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_tests(tests, tmp_prefix):
    """Runs (name, fn(tmp_dir)) pairs in one scratch directory; prints ok/FAIL lines; returns the exit code."""
    failures = 0
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp_dir:
        for name, test in tests:
            try:
                test(Path(tmp_dir))
                print(f"ok: {name}")
            except (AssertionError, OSError) as e:
                failures += 1
                print(f"FAIL: {name}: {e}")
    return 1 if failures else 0
