// `megaton data inspect`: what a dataset holds and what training would sample from it.
// `megaton data bench`: how fast the loader delivers training batches.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "option_range.h"
#include "megaton/data/data_loader.h"
#include "megaton/data/dataset_builder.h"
#include "megaton/data/dataset_summary.h"
#include "megaton/data/tokenizer.h"

namespace megaton::app {

namespace {

// Sampling options shared by both subcommands, named as Megatron's arguments.
struct SamplingOptions {
  data::GptDatasetConfig config;
  std::array<int64_t, 3> num_samples{-1, -1, -1};  // -1: one epoch

  void add_to(CLI::App* cmd, bool seq_length_required) {
    auto* t = cmd->add_option("--seq-length", config.seq_length, "Tokens per sample (inputs; samples hold one more)")
                  ->check(in_range<int64_t>(1, int64_t{1} << 31));
    if (seq_length_required) t->required();
    cmd->add_option("--seed", config.seed, "Sampling seed (numpy RandomState, as Megatron)")
        ->capture_default_str()
        ->check(in_range<int64_t>(0, (int64_t{1} << 32) - 1));
    cmd->add_option("--split", config.split, "train,valid,test document ratios")->capture_default_str();
    cmd->add_option("--data-cache-path", config.cache_dir,
                    "Where sampling indices are cached (default: PREFIX/cache/GPTDataset_indices)");
    cmd->add_option("--train-samples", num_samples[0], "Samples training draws (default: one epoch)")
        ->check(in_range<int64_t>(0, int64_t{1} << 40));
    cmd->add_option("--valid-samples", num_samples[1], "Samples validation draws (default: one epoch)")
        ->check(in_range<int64_t>(0, int64_t{1} << 40));
    cmd->add_option("--test-samples", num_samples[2], "Samples testing draws (default: one epoch)")
        ->check(in_range<int64_t>(0, int64_t{1} << 40));
  }
  std::array<std::optional<int64_t>, 3> counts() const {
    std::array<std::optional<int64_t>, 3> out;
    for (size_t i = 0; i < 3; ++i)
      if (num_samples[i] >= 0) out[i] = num_samples[i];
    return out;
  }
};

// Text of ids, or why it cannot be decoded (ids outside the tokenizer's vocabulary, say).
std::string decode(const data::Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int32_t> narrow;
  for (int64_t id : ids) {
    if (id < INT32_MIN || id > INT32_MAX) return "<id " + std::to_string(id) + " does not fit int32>";
    narrow.push_back(static_cast<int32_t>(id));
  }
  try {
    return tok.decode(narrow);
  } catch (const std::exception& e) {
    return std::string("<cannot decode: ") + e.what() + ">";
  }
}

// One line of terminal output: control characters escaped, long text cut.
std::string one_line(const std::string& text, size_t max_chars) {
  std::string out = "\"";
  for (unsigned char c : text.substr(0, max_chars)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (text.size() > max_chars ? "\"..." : "\"");
}

std::vector<int64_t> document_tokens(const data::IndexedDataset& ds, size_t doc) {
  std::vector<int64_t> out;
  for (auto s = ds.document_indices()[doc]; s < ds.document_indices()[doc + 1]; ++s) {
    auto part = ds.get_int64(static_cast<size_t>(s));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

void inspect(const std::string& prefix, const std::string& tokenizer, SamplingOptions& sampling, int show,
             size_t max_chars, bool json) {
  auto tok = data::make_tokenizer(tokenizer);
  const auto ds = data::IndexedDataset::open(prefix);
  const auto s = data::summarize(ds, 10);
  nlohmann::ordered_json out{{"prefix", prefix},
                             {"dtype", data::megatron_dtype_code(s.dtype)},
                             {"dtype_name", dtype_name(s.dtype)},
                             {"sequences", s.sequences},
                             {"documents", s.documents},
                             {"tokens", s.tokens},
                             {"min_length", s.min_length},
                             {"max_length", s.max_length},
                             {"mean_length", s.mean_length},
                             {"min_token", s.min_token},
                             {"max_token", s.max_token},
                             {"distinct_tokens", s.distinct_tokens},
                             {"top_tokens", s.top_tokens}};
  if (!json) {
    std::printf("%s: %ld documents (%ld sequences), %ld tokens, dtype %s\n", prefix.c_str(), s.documents, s.sequences,
                s.tokens, std::string(dtype_name(s.dtype)).c_str());
    std::printf("  sequence length: min %ld, max %ld, mean %.1f\n", s.min_length, s.max_length, s.mean_length);
    std::printf("  token ids %ld to %ld, %ld distinct; most frequent:", s.min_token, s.max_token, s.distinct_tokens);
    for (size_t i = 0; i < s.top_tokens.size(); ++i) {
      const auto [id, count] = s.top_tokens[i];
      std::printf("%s %ld %s (%.1f%%)", i ? "," : "", id, one_line(decode(*tok, {id}), 12).c_str(),
                  100.0 * static_cast<double>(count) / static_cast<double>(s.tokens));
    }
    std::printf("\n");
  }
  for (size_t d = 0; d < std::min<size_t>(show, ds.num_documents()); ++d) {
    const auto ids = document_tokens(ds, d);
    const std::string text = decode(*tok, ids);
    out["documents_shown"].push_back({{"tokens", ids}, {"text", text}});
    if (!json) std::printf("  document %zu (%zu tokens): %s\n", d, ids.size(), one_line(text, max_chars).c_str());
  }

  if (sampling.config.seq_length > 0) {
    const auto splits = data::build_gpt_splits(prefix, sampling.counts(), sampling.config);
    if (!json)
      std::printf("sampling: seq_length %ld, seed %ld, split %s\n", sampling.config.seq_length, sampling.config.seed,
                  sampling.config.split.c_str());
    for (data::Split split : data::kSplits) {
      const auto& gpt = splits[static_cast<size_t>(split)];
      if (!gpt) continue;
      const std::string name(data::split_name(split));
      nlohmann::ordered_json j{{"samples", gpt->size()},
                               {"num_epochs", gpt->num_epochs()},
                               {"separate_final_epoch", gpt->separate_final_epoch()},
                               {"cache_path", gpt->cache_path()},
                               {"built", gpt->built_anew()}};
      if (!json)
        std::printf("  %s: %ld samples, %ld epoch(s)%s, indices %s %s\n", name.c_str(), gpt->size(), gpt->num_epochs(),
                    gpt->separate_final_epoch() ? " (last shuffled separately)" : "",
                    gpt->built_anew() ? "built at" : "loaded from", gpt->cache_path().c_str());
      std::vector<int32_t> tokens(static_cast<size_t>(gpt->seq_length() + 1));
      for (int64_t i = 0; i < std::min<int64_t>(show, gpt->size()); ++i) {
        gpt->read(i, tokens.data());
        const std::string text = decode(*tok, {tokens.begin(), tokens.end()});
        j["samples_shown"].push_back({{"tokens", tokens}, {"text", text}});
        if (!json) std::printf("    %s sample %ld: %s\n", name.c_str(), i, one_line(text, max_chars).c_str());
      }
      out["splits"][name] = j;
    }
  }
  // Decoded text need not be valid UTF-8 (byte tokens, cut multi-byte characters): replace, do not throw.
  if (json) std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// Reads training micro-batches for about `seconds` (restarting the loader at the end of the data).
void bench(const std::string& data_path, SamplingOptions& sampling, const data::DataLoaderOptions& loader_opts,
           double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto train = data::build_datasets(data::parse_blend(data_path), sampling.counts(), sampling.config)[0];
  if (!train || train->size() < loader_opts.micro_batch_size)
    fail("data path '", data_path, "': the train split has too few samples for one micro-batch");
  const double build_s = std::chrono::duration<double>(Clock::now() - t0).count();

  int64_t batches = 0;
  const auto t1 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    data::DataLoader loader(train, loader_opts);
    data::Batch batch;
    while (elapsed < seconds && loader.next(batch)) {
      ++batches;
      elapsed = std::chrono::duration<double>(Clock::now() - t1).count();
    }
  }
  const double tokens = static_cast<double>(batches * loader_opts.micro_batch_size * train->seq_length());
  std::printf("%s\n", nlohmann::ordered_json{{"tokens_per_s", tokens / elapsed},
                                             {"samples_per_s", batches * loader_opts.micro_batch_size / elapsed},
                                             {"micro_batches", batches},
                                             {"seconds", elapsed},
                                             {"index_build_s", build_s},
                                             {"train_samples", train->size()}}
                          .dump()
                          .c_str());
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto* data_cmd = app.add_subcommand("data", "Inspect datasets and measure the training data loader");
  data_cmd->require_subcommand(1);

  auto* cmd = data_cmd->add_subcommand(
      "inspect",
      "Counts, token histogram and decoded documents of a Megatron .bin/.idx dataset; with --seq-length, "
      "also the samples training would draw (building or loading the cached sampling indices)");
  static std::string prefix, tokenizer = "byte";
  static SamplingOptions inspect_sampling;
  static int show = 3;
  static size_t max_chars = 160;
  static bool json = false;
  cmd->add_option("prefix", prefix, "Dataset prefix (PREFIX.bin / PREFIX.idx)")->required();
  cmd->add_option("--tokenizer", tokenizer, "Tokenizer spec used to decode")->capture_default_str();
  cmd->add_option("--show", show, "Documents (and samples per split) to decode")->capture_default_str()->check(in_range(0, 1 << 20));
  cmd->add_option("--max-chars", max_chars, "Characters shown per decoded text")
      ->capture_default_str()
      ->check(in_range<size_t>(1, size_t{1} << 30));
  cmd->add_flag("--json", json, "One JSON object instead of text (full decoded texts and token ids)");
  inspect_sampling.add_to(cmd, false);
  cmd->callback([] { inspect(prefix, tokenizer, inspect_sampling, show, max_chars, json); });

  auto* b = data_cmd->add_subcommand("bench", "Training micro-batches per second from the data loader; prints JSON");
  static std::string data_path;
  static SamplingOptions bench_sampling;
  static data::DataLoaderOptions loader_opts;
  static double seconds = 3;
  b->add_option("data_path", data_path, "PREFIX, or a blend \"W1 PREFIX1 W2 PREFIX2 ...\"")->required();
  bench_sampling.add_to(b, true);
  b->add_option("--micro-batch-size", loader_opts.micro_batch_size)->capture_default_str()->check(in_range<int64_t>(1, 1 << 20));
  b->add_option("--num-workers", loader_opts.num_workers, "Loader threads")
      ->capture_default_str()
      ->check(in_range(1, data::DataLoader::kMaxWorkers));
  b->add_option("--seconds", seconds, "How long to read")->capture_default_str()->check(in_range(0.0, 86400.0));
  b->callback([] { bench(data_path, bench_sampling, loader_opts, seconds); });
}

}  // namespace megaton::app
