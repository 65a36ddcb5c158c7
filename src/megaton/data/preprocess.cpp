#include "megaton/data/preprocess.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "megaton/core/error.h"
#include "megaton/core/threads.h"
#include "megaton/data/document_reader.h"
#include "megaton/data/indexed_dataset.h"
#include "megaton/data/tokenizer.h"

namespace megaton::data {

namespace {

using Clock = std::chrono::steady_clock;

// Input per tokenizing round: large enough to keep every worker busy, small enough to bound memory.
constexpr size_t kBatchBytes = 16 << 20;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One stderr line redrawn in place, at most five times a second so that printing never slows the run.
class ProgressBar {
 public:
  ProgressBar(uint64_t total_bytes, bool enabled) : total_(total_bytes), enabled_(enabled) {}
  ~ProgressBar() {
    if (drawn_) std::fputc('\n', stderr);  // leave an interrupted bar on its own line before the error
  }

  void update(int64_t docs, uint64_t bytes, bool force = false) {
    if (!enabled_ || (!force && Clock::now() - last_ < std::chrono::milliseconds(200))) return;
    last_ = Clock::now();
    double mb = bytes / 1e6;
    double pct = total_ ? 100.0 * bytes / total_ : 100.0;
    std::fprintf(stderr, "\rpreprocess: %lld documents, %.1f MB, %.1f MB/s, %5.1f%%", static_cast<long long>(docs), mb,
                 mb / std::max(seconds_since(start_), 1e-9), pct);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  uint64_t total_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
};

// Tokens of one document; throws without location, which the caller adds.
std::vector<int32_t> encode_document(const RawDocument& doc, bool json, const PreprocessOptions& opts,
                                     const Tokenizer& tok) {
  std::vector<int32_t> ids;
  if (json) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(doc.text);
    } catch (const nlohmann::json::parse_error& e) {
      fail("malformed JSON: ", e.what());
    }
    auto field = j.is_object() ? j.find(opts.json_key) : j.end();
    if (field == j.end()) fail("expected a JSON object with a \"", opts.json_key, "\" field");
    if (!field->is_string()) fail("field \"", opts.json_key, "\" is not a string");
    ids = tok.encode(field->get_ref<const std::string&>());
  } else {
    ids = tok.encode(doc.text);
  }
  if (opts.append_eod && !ids.empty()) ids.push_back(tok.eod());
  return ids;
}

// Tokenizes a batch on `workers` threads; results stay in input order. The first failing document (in
// input order, so the report does not depend on scheduling) becomes an error naming FILE:LINE.
std::vector<std::vector<int32_t>> encode_batch(const std::vector<RawDocument>& batch, const DocumentReader& reader,
                                               const PreprocessOptions& opts, const Tokenizer& tok, int workers) {
  std::vector<std::vector<int32_t>> out(batch.size());
  std::vector<std::string> errors(batch.size());
  bool json = reader.is_json_lines();
  const auto n = static_cast<int64_t>(batch.size());
#pragma omp parallel for schedule(dynamic, 16) num_threads(workers)
  for (int64_t i = 0; i < n; ++i) {
    try {
      out[i] = encode_document(batch[i], json, opts, tok);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (size_t i = 0; i < batch.size(); ++i)
    if (!errors[i].empty()) fail(reader.path(), ":", batch[i].line, ": ", errors[i]);
  return out;
}

uint64_t total_input_bytes(const std::vector<std::string>& inputs) {
  uint64_t total = 0;
  for (const auto& f : inputs) {
    std::error_code ec;
    uint64_t n = std::filesystem::file_size(f, ec);
    if (ec) fail("cannot read input ", f, ": ", ec.message());
    total += n;
  }
  return total;
}

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& opts) {
  auto start = Clock::now();
  if (opts.inputs.empty()) fail("preprocess: no input files");
  if (opts.output_prefix.empty()) fail("preprocess: no output prefix");
  auto tok = make_tokenizer(opts.tokenizer);
  int workers = opts.workers > 0 ? opts.workers : num_threads();
  ProgressBar bar(total_input_bytes(opts.inputs), opts.progress);

  PreprocessStats stats;
  IndexedDatasetWriter writer(opts.output_prefix, smallest_token_dtype(tok->vocab_size()));
  std::vector<RawDocument> batch;
  for (const auto& input : opts.inputs) {
    DocumentReader reader(input, opts.doc_separator);
    uint64_t before = stats.bytes;
    while (reader.next_batch(batch, kBatchBytes)) {
      for (const auto& ids : encode_batch(batch, reader, opts, *tok, workers)) {
        // Empty documents carry no tokens to train on; skipping them keeps every document non-empty.
        if (ids.empty()) continue;
        writer.add_document(ids);
        ++stats.documents;
        stats.tokens += static_cast<int64_t>(ids.size());
      }
      stats.bytes = before + reader.bytes_read();
      bar.update(stats.documents, stats.bytes);
    }
    stats.bytes = before + reader.bytes_read();
  }
  writer.finalize();
  bar.update(stats.documents, stats.bytes, /*force=*/true);
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace megaton::data
