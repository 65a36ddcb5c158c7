"""Megaton's byte-level BPE (`megaton tokenizer encode/decode` with gpt2:DIR and tiktoken:FILE) checked against
an independent pure-Python implementation: the merge loops of GPT-2's encoder.py and of tiktoken's
_educational.py, with the published pre-tokenizer regexes run by Python's `regex` module (python3-regex).
The vocabulary is trained here (plain BPE on a fortunes file), written in both formats, and must give the
same ids as the reference on text, Unicode edge cases and random bytes; decode must invert encode exactly.

Usage: /usr/bin/python3 tests/python/test_bpe_reference.py --megaton PATH_TO_MEGATON
"""
import base64
import json
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import regex

from check_main import run_checks

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])

CORPUS = Path("/usr/share/games/fortunes/fortunes")
UNICODE_TEXT = ("Ünïcödé façade naïve — 東京タワー 123456 ½ Ⅻ ٣٤٥٦ １２３４ 🙂🙂 don't I'LL WE'VE it'ſ\n"
                "tabs\tand\r\nCRLF  double  spaces \u0085next\u00a0nbsp\u2028ls\u3000ideo  \n\n\n"
                "HelloWorld's a/b//\nÉCOLE école Straße ǅemal ﬁne x\u0301y\n")
INVALID_UTF8_TEXT = (b"caf\xc3\xa9 \xe2\x82 truncated, \xc0\x80 overlong, \xed\xa0\x80 surrogate, \xf4\x90\x80\x80 too "
                     b"big, \xff\xfe\n  lone \x80\x80 continuations\xe2\x82\xac \xe2\x82\xe2\x82\xac\xe2\x82")
MERGES = 400


def bytes_to_unicode():
    """GPT-2's encoder.py: every byte spelled as a printable character."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def pretokenize(data, pattern):
    """Pieces of a byte string: each maximal run of bytes outside well-formed UTF-8 is a piece of its own (the
    surrogateescape decoder marks them), and the regex splits the valid text between."""
    pieces = []
    text = data.decode("utf-8", errors="surrogateescape")
    for segment in re.split("([\udc80-\udcff]+)", text):
        if not segment:
            continue
        if "\udc80" <= segment[0] <= "\udcff":
            pieces.append(segment.encode("utf-8", errors="surrogateescape"))
            continue
        matches = regex.findall(pattern, segment)
        assert "".join(matches) == segment, f"pattern does not tile {segment!r}"
        pieces.extend(m.encode("utf-8") for m in matches)
    return pieces


def merge_pair(word, pair):
    """encoder.py's loop: every occurrence of `pair` in `word`, left to right."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train_bpe(pieces, n_merges):
    """Plain BPE training: repeatedly merge the most frequent adjacent pair within the pieces."""
    words = Counter(tuple(bytes([b]) for b in p) for p in pieces)
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            merged[merge_pair(word, best)] += count
        words = merged
    return merges


def gpt2_encode_piece(piece, ranks, ids):
    """encoder.py's bpe(): merge the lowest-ranked pair (all its occurrences) until no pair has a rank."""
    word = tuple(bytes([b]) for b in piece)
    while len(word) > 1:
        pair = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        word = merge_pair(word, pair)
    return [ids[w] for w in word]


def tiktoken_encode_piece(piece, ranks):
    """tiktoken's _educational.py bpe_encode, after encode_ordinary's whole-piece lookup."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [bytes([b]) for b in piece]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            break
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
    return [ranks[p] for p in parts]


class Reference:
    def __init__(self, pattern, encode_piece):
        self.pattern, self.encode_piece, self.cache = pattern, encode_piece, {}

    def encode(self, data):
        ids = []
        for piece in pretokenize(data, self.pattern):
            if piece not in self.cache:
                self.cache[piece] = self.encode_piece(piece)
            ids.extend(self.cache[piece])
        return ids


def run(megaton, args, stdin):
    cmd = [megaton, "tokenizer", *args]
    result = subprocess.run(cmd, input=stdin, capture_output=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.decode()}"
    return result.stdout


def megaton_encode_lines(megaton, spec, data):
    out = run(megaton, ["encode", "--tokenizer", spec], data).decode()
    return [[int(t) for t in line.split()] for line in out.split("\n")[:-1]]


def check_tokenizer(megaton, spec, reference, texts):
    """Line mode and --whole equal the reference; decode inverts encode byte for byte."""
    for name, data in texts.items():
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        want = [reference.encode(line) for line in lines]
        got = megaton_encode_lines(megaton, spec, data)
        assert len(got) == len(want), f"{spec} {name}: {len(got)} lines, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"{spec} {name} line {i + 1}: {g[:20]}... != reference {w[:20]}..."
        whole = run(megaton, ["encode", "--whole", "--tokenizer", spec], data)
        ids = [int(t) for t in whole.split()]
        assert ids == reference.encode(data), f"{spec} {name} --whole differs from the reference"
        back = run(megaton, ["decode", "--whole", "--tokenizer", spec], whole)
        assert back == data, f"{spec} {name}: decode(encode(x)) != x"
        # Line mode inverts too (every line comes back followed by a newline).
        decoded = run(megaton, ["decode", "--tokenizer", spec], "\n".join(" ".join(map(str, g)) for g in got).encode()
                      + b"\n")
        assert decoded == b"".join(line + b"\n" for line in lines), f"{spec} {name}: line-mode decode differs"


def write_gpt2(directory, merges):
    """vocab.json ids as GPT-2's: the bytes in bytes_to_unicode order, then one token per new merge result."""
    spell = bytes_to_unicode()
    ids = {bytes([b]): i for i, b in enumerate(spell)}
    for a, b in merges:
        ids.setdefault(a + b, len(ids))
    vocab = {"".join(spell[c] for c in tok): i for tok, i in ids.items()}
    vocab["<|endoftext|>"] = len(vocab)
    directory.mkdir()
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [" ".join("".join(spell[c] for c in t) for t in m) for m in merges]
    (directory / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ids


def write_tiktoken(path, ranks):
    rows = sorted(ranks.items(), key=lambda item: item[1])
    path.write_text("".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in rows))


def test_gpt2_and_tiktoken(megaton, tmp):
    # Merges from GPT-2 pre-tokens of the corpus, then merges trained across piece boundaries until every
    # line of the edge-case texts is one token, so that their ids depend on exactly where each pattern
    # splits. The second set repeats some pairs of the first: the last rank wins (as in encoder.py's dict).
    merges = train_bpe(pretokenize(CORPUS.read_bytes(), GPT2_PATTERN), MERGES)
    merges += train_bpe((UNICODE_TEXT.encode("utf-8") + b"\n" + INVALID_UTF8_TEXT).split(b"\n"), 10**6)
    rng = random.Random(5)
    texts = {"corpus": CORPUS.read_bytes(),
             "unicode": UNICODE_TEXT.encode("utf-8"),
             "random_bytes": bytes(rng.randrange(256) for _ in range(20000)),
             "text_with_invalid_utf8": INVALID_UTF8_TEXT}

    ids = write_gpt2(tmp / "gpt2", merges)
    ranks = {m: i for i, m in enumerate(merges)}
    check_tokenizer(megaton, f"gpt2:{tmp / 'gpt2'}",
                    Reference(GPT2_PATTERN, lambda p: gpt2_encode_piece(p, ranks, ids)), texts)

    # The same tokens as a tiktoken rank file (rank = id, as tiktoken's gpt2 file): an unknown file, so the
    # cl100k pattern applies.
    write_tiktoken(tmp / "small.tiktoken", ids)
    check_tokenizer(megaton, f"tiktoken:{tmp / 'small.tiktoken'}",
                    Reference(CL100K_PATTERN, lambda p: tiktoken_encode_piece(p, ids)), texts)

    # Padded to o200k_base's 199998 ranks with tokens that never occur, it is read as o200k: its pattern.
    padded = dict(ids)
    for i in range(199998 - len(ids)):
        padded[b"\x00\x00" + i.to_bytes(3, "big")] = len(padded)
    write_tiktoken(tmp / "o200k_sized.tiktoken", padded)
    check_tokenizer(megaton, f"tiktoken:{tmp / 'o200k_sized.tiktoken'}",
                    Reference(O200K_PATTERN, lambda p: tiktoken_encode_piece(p, padded)),
                    {k: texts[k] for k in ("unicode", "text_with_invalid_utf8")})


def test_bad_files(megaton, tmp):
    directory = tmp / "bad"
    write_gpt2(directory, [(b"a", b"b")])
    (directory / "merges.txt").write_text("#version: 0.2\na b\na b c\n")
    result = subprocess.run([megaton, "tokenizer", "encode", "--tokenizer", f"gpt2:{directory}"], input=b"x",
                            capture_output=True)
    assert result.returncode != 0, "a malformed merges.txt was accepted"
    assert f"{directory / 'merges.txt'}:3" in result.stderr.decode(), f"no file:line in {result.stderr.decode()!r}"


if __name__ == "__main__":
    sys.exit(run_checks(__doc__.splitlines()[0],
                        [("gpt2_and_tiktoken", test_gpt2_and_tiktoken), ("bad_files", test_bad_files)], "megaton_bpe_"))
