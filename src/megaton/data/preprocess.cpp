#include "megaton/data/preprocess.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>

#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"
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
// Percent and ETA follow the bytes on disk (compressed inputs advance by their compressed size); the
// MB/s rate counts the text actually tokenized.
class ProgressBar {
 public:
  ProgressBar(uint64_t total_disk_bytes, bool enabled) : total_(total_disk_bytes), enabled_(enabled) {}
  ~ProgressBar() {
    if (drawn_) std::fputc('\n', stderr);  // leave an interrupted bar on its own line before the error
  }

  void update(int64_t docs, uint64_t text_bytes, uint64_t disk_bytes, bool force = false) {
    if (!enabled_ || (!force && Clock::now() - last_ < std::chrono::milliseconds(200))) return;
    last_ = Clock::now();
    const double secs = std::max(seconds_since(start_), 1e-9), mb = text_bytes / 1e6;
    const double done = total_ ? static_cast<double>(disk_bytes) / total_ : 1.0;
    const double eta = done > 0 ? secs * (1 - done) / done : 0;
    std::fprintf(stderr, "\rpreprocess: %lld docs (%.0f/s), %.1f MB (%.1f MB/s), %5.1f%%, ETA %lldm%02llds ",
                 static_cast<long long>(docs), docs / secs, mb, mb / secs, 100 * done, static_cast<long long>(eta) / 60,
                 static_cast<long long>(eta) % 60);
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

// The text field of one JSON Lines document; throws saying what is malformed, without location.
std::string json_text(std::string_view line, const std::string& key) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    fail("malformed JSON: ", e.what());
  }
  auto field = j.is_object() ? j.find(key) : j.end();
  if (field == j.end()) fail("expected a JSON object with a \"", key, "\" field");
  if (!field->is_string()) fail("field \"", key, "\" is not a string");
  return std::move(field->get_ref<std::string&>());
}

struct InputBatch {
  std::vector<RawDocument> documents;
  uint64_t bytes_read = 0, disk_bytes_read = 0;  // the reader's counts once this batch was read
  bool more = false;                             // false: the input is exhausted and documents is empty
};

struct EncodedDocument {
  std::vector<int32_t> ids;
  std::string error;      // non-empty when the document failed
  bool bad_line = false;  // the failure is malformed JSON Lines input (skippable), not a tokenizer error
};

EncodedDocument encode_document(const RawDocument& doc, bool json, const PreprocessOptions& opts,
                                const Tokenizer& tok) {
  EncodedDocument r;
  std::string decoded;
  if (json) {
    try {
      decoded = json_text(doc.text, opts.json_key);
    } catch (const std::exception& e) {
      r.error = e.what();
      r.bad_line = true;
      return r;
    }
  }
  try {
    r.ids = tok.encode(json ? decoded : doc.text);
  } catch (const std::exception& e) {
    r.error = e.what();
    return r;
  }
  if (opts.append_eod && !r.ids.empty()) r.ids.push_back(tok.eod());
  return r;
}

// Tokenizes a batch on `workers` threads; results stay in input order. Failures are settled in input
// order, so the report does not depend on scheduling: a malformed line is counted and dropped with
// --skip-bad-lines, any other failure becomes an error naming FILE:LINE.
std::vector<EncodedDocument> encode_batch(const std::vector<RawDocument>& batch, const DocumentReader& reader,
                                          const PreprocessOptions& opts, const Tokenizer& tok, int workers,
                                          PreprocessStats& stats) {
  std::vector<EncodedDocument> out(batch.size());
  const bool json = reader.is_json_lines();
  const auto n = static_cast<int64_t>(batch.size());
#pragma omp parallel for schedule(dynamic, 16) num_threads(workers)
  for (int64_t i = 0; i < n; ++i) out[i] = encode_document(batch[i], json, opts, tok);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (out[i].error.empty()) continue;
    std::string where = reader.path() + ":" + std::to_string(batch[i].line) + ": " + out[i].error;
    if (!(out[i].bad_line && opts.skip_bad_lines)) fail(where);
    if (stats.skipped_lines++ == 0) stats.first_skipped = std::move(where);
  }
  return out;
}

uint64_t total_input_bytes(const std::vector<std::string>& inputs) {
  uint64_t total = 0;
  for (const auto& f : inputs) {
    struct stat st {};
    if (::fstat(open_regular_file(f, "input").get(), &st) != 0) fail("cannot stat input ", f, ": ", std::strerror(errno));
    total += static_cast<uint64_t>(st.st_size);
  }
  return total;
}

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& opts) {
  auto start = Clock::now();
  if (opts.inputs.empty()) fail("preprocess: no input files");
  if (opts.output_prefix.empty()) fail("preprocess: no output prefix");
  auto tok = make_tokenizer(opts.tokenizer);
  if (opts.workers < 0 || opts.workers > kMaxPreprocessWorkers)
    fail("preprocess: workers must be in [0, ", kMaxPreprocessWorkers, "] (0: all cores), got ", opts.workers);
  int workers = opts.workers > 0 ? opts.workers : num_threads();
  ProgressBar bar(total_input_bytes(opts.inputs), opts.progress);

  PreprocessStats stats;
  stats.dtype = smallest_token_dtype(tok->vocab_size());
  IndexedDatasetWriter writer(opts.output_prefix, stats.dtype);
  uint64_t disk_before = 0;
  for (const auto& input : opts.inputs) {
    DocumentReader reader(input, opts.doc_separator);
    const uint64_t before = stats.bytes;
    auto read = [&reader] {
      InputBatch in;
      in.more = reader.next_batch(in.documents, kBatchBytes);
      in.bytes_read = reader.bytes_read();
      in.disk_bytes_read = reader.disk_bytes_read();
      return in;
    };
    // The next batch is read while this one is tokenized: reading, decompressing and splitting lines is
    // serial work that would otherwise leave the tokenizing threads idle.
    std::future<InputBatch> pending = std::async(std::launch::async, read);
    for (;;) {
      InputBatch in = pending.get();
      stats.bytes = before + in.bytes_read;
      if (!in.more) {
        disk_before += in.disk_bytes_read;
        break;
      }
      pending = std::async(std::launch::async, read);
      for (const auto& doc : encode_batch(in.documents, reader, opts, *tok, workers, stats)) {
        // Empty documents carry no tokens to train on; skipping them keeps every document non-empty.
        if (doc.ids.empty()) continue;
        writer.add_document(doc.ids);
        ++stats.documents;
        stats.tokens += static_cast<int64_t>(doc.ids.size());
      }
      bar.update(stats.documents, stats.bytes, disk_before + in.disk_bytes_read);
    }
  }
  writer.finalize();
  bar.update(stats.documents, stats.bytes, disk_before, /*force=*/true);
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace megaton::data
