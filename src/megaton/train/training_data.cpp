#include "megaton/train/training_data.h"

#include <algorithm>
#include <filesystem>

#include "megaton/core/error.h"
#include "megaton/data/dataset_builder.h"
#include "megaton/data/token_stream.h"

namespace megaton::train {

namespace {

// Opens one dataset prefix named by config key `key`, checking it against the model; raises
// max_token to the largest id seen.
std::shared_ptr<const data::TokenStream> open_checked(const std::string& prefix, const std::string& key,
                                                     const TrainConfig& cfg, int32_t& max_token) {
  namespace fs = std::filesystem;
  if (!fs::exists(prefix + ".idx") || !fs::exists(prefix + ".bin"))
    fail("config key '", key, "': dataset '", prefix, "' not found (expected ", prefix, ".bin and ", prefix, ".idx)");
  for (const char* ext : {".idx", ".bin"})
    if (fs::is_directory(prefix + ext))
      fail("config key '", key, "': '", prefix, ext, "' is a directory; expected the dataset file");
  auto s = std::make_shared<data::TokenStream>(prefix);
  if (s->num_samples(cfg.seq_length) == 0)
    fail("config key '", key, "': dataset '", prefix, "' has ", s->size(), " tokens, fewer than one sample of ",
         cfg.seq_length + 1);
  const int32_t top = s->max_token(int64_t{1} << 22);
  if (top >= cfg.model.vocab_size)
    fail("config key '", key, "': dataset '", prefix, "' holds token id ", top, " but the model's vocab_size is ",
         cfg.model.vocab_size, " (vocab mismatch between data and model)");
  max_token = std::max(max_token, top);
  return s;
}

}  // namespace

TrainingData build_training_data(const TrainConfig& cfg) {
  if (cfg.data_path.empty()) fail("config key 'data.data_path' is empty: no training data");
  const data::Blend blend = data::parse_blend(cfg.data_path);
  std::vector<std::shared_ptr<const data::TokenStream>> streams;
  TrainingData out;
  for (const std::string& prefix : blend.prefixes)
    streams.push_back(open_checked(prefix, "data.data_path", cfg, out.max_token));
  const int64_t train_samples = (cfg.train_iters + (cfg.rewind ? cfg.max_rewinds : 0)) * cfg.global_batch_size;

  if (!cfg.valid_data_path.empty())
    out.valid = std::make_shared<data::StreamSamples>(
        open_checked(cfg.valid_data_path, "data.valid_data_path", cfg, out.max_token), cfg.seq_length);
  if (!cfg.shuffle) {
    if (streams.size() != 1)
      fail("config key 'data.data_path': data.shuffle = false reads one dataset in order, but '", cfg.data_path,
           "' names ", streams.size());
    out.train = std::make_shared<data::StreamSamples>(streams.front(), cfg.seq_length, train_samples);
    return out;
  }
  // One epoch suffices for the evaluation splits of a single unweighted dataset; blends need a
  // count for every split (Megatron sizes each part of the blend from it).
  const bool single = blend.prefixes.size() == 1;
  const std::optional<int64_t> eval_samples =
      cfg.eval_iters > 0 ? std::optional<int64_t>(cfg.eval_iters * cfg.micro_batch_size)
                         : (single ? std::nullopt : std::optional<int64_t>(cfg.micro_batch_size));
  // Training never draws test samples; a blend still needs a count for the split, and 0 keeps a
  // test part without documents (small data, a 1/1000 ratio) from being an error.
  const std::optional<int64_t> test_samples = single ? std::nullopt : std::optional<int64_t>(0);
  auto splits = data::build_datasets(blend, {train_samples, eval_samples, test_samples},
                                     {cfg.seq_length, cfg.seed, cfg.split, cfg.data_cache_path});
  if (!splits[0]) fail("config key 'data.split': '", cfg.split, "' leaves no documents for training");
  out.train = splits[0];
  if (!out.valid) out.valid = splits[1];
  return out;
}

}  // namespace megaton::train
