// libFuzzer harness: a JSON Lines corpus (plain, gzip or zstd: told by its magic bytes) run through
// `megaton preprocess --skip-bad-lines` with the byte tokenizer; the dataset written must open and
// hold the documents reported.
#include "fuzz_input.h"
#include "megaton/data/indexed_dataset.h"
#include "megaton/data/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  megaton::data::PreprocessOptions opts;
  opts.inputs = {megaton::fuzz::write_scratch("corpus.jsonl", megaton::fuzz::as_text(data, size))};
  opts.output_prefix = (megaton::fuzz::scratch_dir() / "corpus").string();
  opts.skip_bad_lines = true;
  opts.append_eod = true;
  opts.workers = 1;
  opts.progress = false;
  megaton::fuzz::parse_or_reject([&] {
    const auto stats = megaton::data::preprocess(opts);
    const auto ds = megaton::data::IndexedDataset::open(opts.output_prefix);
    megaton::fuzz::require(static_cast<int64_t>(ds.num_documents()) == stats.documents);
  });
  return 0;
}
