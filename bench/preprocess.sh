#!/usr/bin/env bash
# Preprocessing throughput: `megaton preprocess` with a SentencePiece model vs Debian's spm_encode (one
# thread, the reference tool) encoding the same texts with the same model, in the same run.
#
#   bench/preprocess.sh [MEGATON] [MB]      defaults: build/megaton 100; WORKERS=2 sets megaton's threads
#
# Corpus: every Debian fortune, one per line (inner whitespace folded to spaces), repeated to MB
# megabytes; spm_encode reads it as text lines, megaton as the same lines wrapped in JSON Lines. Both
# rates are text megabytes (the plain file's size) per wall-clock second. The model is a unigram
# SentencePiece model of 8000 pieces trained by Debian's spm_train on the unique fortunes.
set -euo pipefail
megaton=$(realpath "${1:-build/megaton}")
mb=${2:-100}
workers=${WORKERS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$megaton" bench --cpu-info

/usr/bin/python3 - "$work" "$mb" <<'PY'
import json, pathlib, re, sys
work, mb = pathlib.Path(sys.argv[1]), int(sys.argv[2])
texts = []
for f in sorted(pathlib.Path("/usr/share/games/fortunes").iterdir()):
    if f.is_file() and f.suffix not in (".dat", ".u8") and not f.is_symlink():
        for block in f.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            line = re.sub(r"\s+", " ", block).strip()
            if line:
                texts.append(line)
(work / "unique.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
with open(work / "corpus.txt", "w", encoding="utf-8") as txt, open(work / "corpus.jsonl", "w", encoding="utf-8") as js:
    size = 0
    while size < mb * 1_000_000:
        for t in texts:
            txt.write(t + "\n")
            js.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
            size += len(t.encode("utf-8")) + 1
PY

spm_train --input="$work/unique.txt" --model_prefix="$work/spm" --vocab_size=8000 --model_type=unigram \
  --minloglevel=2 >/dev/null 2>&1
text_mb=$(stat -c %s "$work/corpus.txt" | awk '{printf "%.1f", $1 / 1e6}')

# Wall and CPU seconds of each tool; CPU time shows per-core efficiency when other work shares the machine.
timed() { /usr/bin/time -f "%e %U %S" -o "$work/time" "$@" >>"$work/log"; read -r wall user sys <"$work/time"; echo "$wall $(echo "$user + $sys" | bc)"; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
read -r spm_wall spm_cpu < <(timed sh -c "spm_encode --model='$work/spm.model' --output_format=id <'$work/corpus.txt' \
  >'$work/spm_ids.txt'")
read -r meg_wall meg_cpu < <(timed "$megaton" preprocess --input "$work/corpus.jsonl" --output-prefix "$work/out" \
  --tokenizer "sentencepiece:$work/spm.model" --workers "$workers" --no-progress)

echo "corpus: $text_mb MB of text, $(wc -l <"$work/corpus.txt") fortunes; model: SentencePiece unigram 8000"
cat "$work/log"
echo "spm_encode tokens: $(wc -w <"$work/spm_ids.txt"); megaton tokens: $("$megaton" data inspect "$work/out" --json \
  --show 0 | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["tokens"])')"
awk -v mb="$text_mb" -v sw="$spm_wall" -v sc="$spm_cpu" -v mw="$meg_wall" -v mc="$meg_cpu" -v w="$workers" 'BEGIN {
  printf "spm_encode (1 thread):           %6.1f s wall, %6.1f MB/s; %6.1f s CPU, %5.1f MB per CPU-s\n", sw, mb / sw, sc, mb / sc
  printf "megaton preprocess (%d workers): %6.1f s wall, %6.1f MB/s; %6.1f s CPU, %5.1f MB per CPU-s\n", w, mw, mb / mw, mc, mb / mc
  printf "ratio megaton / spm_encode: %.2fx wall-clock\n", sw / mw }'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
