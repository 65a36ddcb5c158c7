"""Megaton's SentencePiece support checked against Debian's SentencePiece command-line tools: a model trained by
`megaton tokenizer train` on fortune files (unigram and BPE) must give the ids of `spm_encode --output_format=id`
line for line, decode like `spm_decode`, round-trip the text exactly, and drive `megaton preprocess`.

Usage: /usr/bin/python3 tests/python/test_sentencepiece_spm.py --megaton PATH_TO_MEGATON
"""
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from check_main import run_checks

FORTUNES = Path("/usr/share/games/fortunes")
TRAIN_FILES = [FORTUNES / name for name in ("fortunes", "science", "computers")]
# Characters the training text lacks reach the byte-fallback pieces; spaces and tabs must survive as they are.
EXTRA_TEXT = "naïve café 東京 🙂 ½\n  two leading spaces,\ttab,  double  spaces, trailing \n\nEnd.\n"


def run(cmd, stdin=b""):
    result = subprocess.run(cmd, input=stdin, capture_output=True)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed ({result.returncode}): {result.stderr.decode()}"
    return result.stdout


def check_model(megaton, model, text):
    spec = f"sentencepiece:{model}"
    ours = run([megaton, "tokenizer", "encode", "--tokenizer", spec], text)
    theirs = run(["spm_encode", f"--model={model}", "--output_format=id"], text)
    ours_lines, theirs_lines = ours.decode().split("\n"), theirs.decode().split("\n")
    assert len(ours_lines) == len(theirs_lines), f"{model}: {len(ours_lines)} lines, spm_encode {len(theirs_lines)}"
    for i, (a, b) in enumerate(zip(ours_lines, theirs_lines)):
        assert a == b, f"{model} line {i + 1}: ids {a[:80]!r} != spm_encode {b[:80]!r}"

    decoded = run([megaton, "tokenizer", "decode", "--tokenizer", spec], ours)
    assert decoded == text, f"{model}: decode(encode(text)) != text"
    assert decoded == run(["spm_decode", f"--model={model}", "--input_format=id"], ours), f"{model}: != spm_decode"
    whole = run([megaton, "tokenizer", "encode", "--whole", "--tokenizer", spec], text)
    assert run([megaton, "tokenizer", "decode", "--whole", "--tokenizer", spec], whole) == text, \
        f"{model}: --whole round trip differs"
    return [int(t) for t in whole.split()]


def check_preprocess(megaton, model, text_file, whole_ids, tmp):
    """`preprocess --tokenizer sentencepiece:...` writes the tokens of `encode --whole` as uint16 (code 8)."""
    prefix = str(tmp / "pre")
    run([megaton, "preprocess", "--input", text_file, "--output-prefix", prefix, "--tokenizer",
         f"sentencepiece:{model}"])
    idx = Path(prefix + ".idx").read_bytes()
    code, n_seq = struct.unpack_from("<BQ", idx, 17)
    assert code == 8, f"{prefix}.idx: dtype code {code}, expected 8 (uint16) for a 1000-piece vocabulary"
    assert n_seq == 1, f"{prefix}.idx: {n_seq} sequences, expected the file as one document"
    tokens = list(struct.unpack(f"<{len(whole_ids)}H", Path(prefix + ".bin").read_bytes()))
    assert tokens == whole_ids, f"{prefix}.bin: tokens differ from `tokenizer encode --whole`"


def test_models(megaton, tmp):
    assert shutil.which("spm_encode"), "spm_encode not found: apt-get install sentencepiece"
    text = b"".join(f.read_bytes() for f in TRAIN_FILES[:2]) + EXTRA_TEXT.encode("utf-8")
    (tmp / "text.txt").write_bytes(text)
    for kind in ("unigram", "bpe"):
        prefix = tmp / kind
        out = run([megaton, "tokenizer", "train", "--input", *TRAIN_FILES, "--vocab-size", "1000", "--type", kind,
                   "--output-prefix", prefix, "--trainer-arg", "minloglevel=1"])
        assert b"1000 pieces" in out, f"train printed {out!r}"
        whole_ids = check_model(megaton, f"{prefix}.model", text)
        if kind == "unigram":
            check_preprocess(megaton, f"{prefix}.model", tmp / "text.txt", whole_ids, tmp)


def test_bad_input(megaton, tmp):
    missing = subprocess.run([megaton, "tokenizer", "encode", "--tokenizer", f"sentencepiece:{tmp}/none.model"],
                             input=b"x", capture_output=True)
    assert missing.returncode != 0 and f"{tmp}/none.model" in missing.stderr.decode(), missing.stderr.decode()
    (tmp / "bad.model").write_bytes(b"not a model")
    bad = subprocess.run([megaton, "tokenizer", "encode", "--tokenizer", f"sentencepiece:{tmp}/bad.model"],
                         input=b"x", capture_output=True)
    assert bad.returncode != 0 and f"{tmp}/bad.model" in bad.stderr.decode(), bad.stderr.decode()


if __name__ == "__main__":
    sys.exit(run_checks(__doc__.splitlines()[0], [("models", test_models), ("bad_input", test_bad_input)],
                        "megaton_spm_"))
