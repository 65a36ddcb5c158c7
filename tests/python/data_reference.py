"""Shared pieces of the data pipeline's Python checks: independent numpy restatements of Megatron-LM's
indexed dataset layout (megatron/core/datasets/indexed_dataset.py: PREFIX.idx holds magic, version, dtype
code, counts, sequence lengths, byte pointers and document indices; PREFIX.bin the tokens), of its GPTDataset
sampling indices (gpt_dataset.py, helpers.cpp build_sample_idx, blended_megatron_dataset_config.py split
parsing) and of its BlendedDataset (blended_dataset.py, helpers.cpp build_blending_indices,
blended_megatron_dataset_builder.py sizes); running the megaton CLI for its JSON output; a minimal test runner.
"""
import json
import math
import re
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


# --- Megatron's GPTDataset indices -----------------------------------------------------------------

def split_ranges(split, num_documents):
    """parse_and_normalize_split + convert_split_vector_to_split_matrix + the builder's round()."""
    ratios = [float(x) for x in re.findall(r"[.0-9]+", split)]
    ratios += [0.0] * (3 - len(ratios))
    ratios = (np.array(ratios, dtype=np.float64) / np.sum(ratios)).tolist()
    bounds = [0.0]
    for r in ratios:
        bounds.append(bounds[-1] + r)
    out = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        out.append(None if end <= begin else (int(round(begin * num_documents)), int(round(end * num_documents))))
    return out


def document_index(documents, num_epochs, rng, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        index = np.mgrid[0:num_epochs, 0:len(documents)][1]
        index[:] = documents
        index = index.reshape(-1).astype(np.int32)
        rng.shuffle(index)
        return index
    first = document_index(documents, num_epochs - 1, rng, False)
    last = document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def sample_index(sizes, doc_index, seq_length, num_epochs, tokens_per_epoch):
    """build_sample_idx with drop_last_partial_sequence=True, add_extra_token_to_sequence=1."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    d, offset = 0, 0
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_index[d]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                assert d != len(doc_index) - 1
                d += 1
                offset = 0
        out[s] = (d, offset)
    return out


def shuffle_index(num_samples, total_size, rng):
    first = np.arange(0, num_samples, dtype=np.uint32)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=np.uint32)
    rng.shuffle(last)
    return np.concatenate((first, last))


def megatron_indices(sizes, documents, num_samples, seq_length, seed):
    """GPTDataset._build_document_sample_shuffle_indices; returns (doc, sample, shuffle, separate)."""
    tokens_per_epoch = int(np.sum(sizes[documents]))
    num_epochs = 1
    if num_samples is not None:
        tokens = tokens_per_epoch
        while tokens < num_samples * seq_length + 1:
            num_epochs += 1
            tokens += tokens_per_epoch
    separate = False
    if num_epochs > 1:
        sans_final = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        from_final = num_samples - sans_final
        per_epoch = (tokens_per_epoch - 1) // seq_length
        assert 0 <= from_final <= per_epoch + 1
        separate = from_final < int(0.80 * per_epoch)
    rng = np.random.RandomState(seed)
    doc = document_index(documents, num_epochs, rng, separate)
    sample = sample_index(sizes, doc, seq_length, num_epochs, tokens_per_epoch)
    total = sample.shape[0] - 1
    shuffle = shuffle_index(sans_final if separate else total, total, rng)
    return doc, sample, shuffle, separate


def megatron_sample(sequences, doc, sample, shuffle, i):
    """_query_document_sample_shuffle_indices: the tokens of sample i."""
    s = shuffle[i]
    (d0, o0), (d1, o1) = sample[s], sample[s + 1]
    if d0 == d1:
        return sequences[doc[d0]][o0:o1 + 1].tolist()
    parts = [sequences[doc[d0]][o0:]] + [sequences[doc[d]] for d in range(d0 + 1, d1)] + \
        [sequences[doc[d1]][:o1 + 1]]
    return np.concatenate(parts).tolist()


class GptDatasetSamples:
    """Megatron's GPTDataset over `documents` (sequence ids) of `sequences`, asked for `num_samples` samples:
    sample i is its i-th token window (seq_length + 1 tokens) in shuffled order."""

    def __init__(self, sequences, documents, num_samples, seq_length, seed):
        sizes = np.array([len(s) for s in sequences], dtype=np.int32)
        self.sequences = sequences
        self.doc, self.sample, self.shuffle, _ = megatron_indices(sizes, documents, num_samples, seq_length, seed)

    def __len__(self):
        return len(self.shuffle)

    def __getitem__(self, i):
        return megatron_sample(self.sequences, self.doc, self.sample, self.shuffle, i)


# --- Megatron's BlendedDataset --------------------------------------------------------------------------

MID_LEVEL_DATASET_SURPLUS = 0.005  # BlendedMegatronDatasetConfig.mid_level_dataset_surplus


def blending_indices(weights, size):
    """build_blending_indices: sample i goes to the dataset furthest below its share of max(i, 1) samples
    (np.argmax: the first one on ties) and is that dataset's next unused sample."""
    weights = np.asarray(weights, dtype=np.float64)
    taken = np.zeros(len(weights), dtype=np.int64)
    dataset, sample = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    for i in range(size):
        d = int(np.argmax(weights * max(i, 1) - taken))
        dataset[i], sample[i] = d, taken[d]
        taken[d] += 1
    return dataset, sample


def blend_sizes(weights, num_samples):
    """_get_size_per_split_per_dataset for one split: dataset j is drawn ceil(n w_j) times (the blend's size is
    their sum) and built for that count plus the surplus, so the blend never runs it dry."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / np.sum(weights)
    drawn = [int(math.ceil(num_samples * w)) for w in weights]
    built = [int(math.ceil(n * (1 + MID_LEVEL_DATASET_SURPLUS))) for n in drawn]
    return weights, drawn, built


class BlendedSamples:
    """Megatron's BlendedDataset: sample i is sample dataset_sample_index[i] of dataset dataset_index[i]."""

    def __init__(self, datasets, weights, size):
        self.datasets = datasets
        self.dataset_index, self.dataset_sample_index = blending_indices(weights, size)

    def __len__(self):
        return len(self.dataset_index)

    def __getitem__(self, i):
        return self.datasets[self.dataset_index[i]][self.dataset_sample_index[i]]


def megatron_train_samples(corpora, weights, split, num_samples, seq_length, seed):
    """The training split Megatron's BlendedMegatronDatasetBuilder makes of a data path: `corpora` are the
    datasets' sequence lists; one without weights is a GPTDataset for num_samples, several with weights a
    BlendedDataset of one GPTDataset each."""
    def train_split(sequences, n):
        begin, end = split_ranges(split, len(sequences))[0]
        return GptDatasetSamples(sequences, np.arange(begin, end, dtype=np.int32), n, seq_length, seed)

    if weights is None:
        assert len(corpora) == 1, "an unweighted blend is not restated here"
        return train_split(corpora[0], num_samples)
    weights, drawn, built = blend_sizes(weights, num_samples)
    return BlendedSamples([train_split(c, n) for c, n in zip(corpora, built)], weights, sum(drawn))


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
