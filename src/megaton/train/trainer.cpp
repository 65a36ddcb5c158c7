#include "megaton/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "megaton/core/threads.h"
#include "megaton/data/tokenizer.h"
#include "megaton/infer/generate.h"
#include "megaton/kernels/sgemm_ceiling.h"
#include "megaton/models/hf_format.h"
#include "megaton/optim/grad_clip.h"
#include "megaton/train/evaluate.h"
#include "megaton/train/metrics_log.h"

namespace megaton::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<data::TokenStream> open_stream(const std::string& prefix, const std::string& key,
                                               const models::TransformerConfig& model, int64_t T) {
  if (prefix.empty()) return nullptr;
  if (!fs::exists(prefix + ".idx") || !fs::exists(prefix + ".bin"))
    fail("config key '", key, "': dataset '", prefix, "' not found (expected ", prefix, ".bin and ", prefix, ".idx)");
  auto s = std::make_unique<data::TokenStream>(prefix);
  if (s->num_samples(T) == 0)
    fail("config key '", key, "': dataset '", prefix, "' has ", s->size(), " tokens, fewer than one sample of ",
         T + 1);
  const int32_t top = s->max_token(int64_t{1} << 22);
  if (top >= model.vocab_size)
    fail("config key '", key, "': dataset '", prefix, "' holds token id ", top, " but the model's vocab_size is ",
         model.vocab_size, " (vocab mismatch between data and model)");
  return s;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<int64_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

Trainer::Trainer(TrainConfig config) : cfg_(std::move(config)) {
  set_num_threads(static_cast<int>(cfg_.threads));
  if (cfg_.data_path.empty()) fail("config key 'data.data_path' is empty: no training data");
  auto tokenizer = data::make_tokenizer(cfg_.tokenizer);
  if (tokenizer->vocab_size() > cfg_.model.vocab_size)
    fail("config key 'data.tokenizer': tokenizer '", cfg_.tokenizer, "' has ", tokenizer->vocab_size(),
         " ids but the model's vocab_size is ", cfg_.model.vocab_size);
  train_data_ = open_stream(cfg_.data_path, "data.data_path", cfg_.model, cfg_.seq_length);
  valid_data_ = open_stream(cfg_.valid_data_path, "data.valid_data_path", cfg_.model, cfg_.seq_length);
  if (!cfg_.load.empty()) {
    model_ = models::load_hf_model(cfg_.load);
  } else {
    model_ = std::make_unique<models::TransformerModel>(cfg_.model);
    model_->init_weights(static_cast<uint64_t>(cfg_.seed));
  }
  optimizer_ = std::make_unique<optim::AdamW>(
      model_->parameters(),
      optim::AdamWConfig{cfg_.lr, cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps, cfg_.weight_decay});
  schedule_ = {cfg_.lr, cfg_.min_lr, cfg_.lr_warmup_iters, cfg_.lr_decay_iters,
               optim::lr_decay_style_from_name(cfg_.lr_decay_style)};
  schedule_.lr_at(0);  // validates warmup vs decay steps now, before any file is written
  order_ = std::make_unique<SampleOrder>(train_data_->num_samples(cfg_.seq_length), static_cast<uint64_t>(cfg_.seed),
                                         cfg_.shuffle);
  peak_gflops_ = cfg_.peak_tflops > 0 ? cfg_.peak_tflops * 1e3 : kernels::measure_sgemm_gflops();
}

void Trainer::train_step(int64_t step, std::vector<double>& rates) {
  const auto t0 = Clock::now();
  const int64_t mbs = cfg_.micro_batch_size, T = cfg_.seq_length, accum = cfg_.grad_accum_steps();
  nn::zero_grads(model_->parameters());
  double loss = 0;
  std::vector<int64_t> ids(static_cast<size_t>(mbs));
  for (int64_t m = 0; m < accum; ++m) {
    const int64_t first = (step - 1) * cfg_.global_batch_size + m * mbs;  // stream position
    for (int64_t b = 0; b < mbs; ++b) ids[static_cast<size_t>(b)] = order_->at(first + b);
    Tensor inputs = Tensor::empty({mbs, T}, DType::I32, MemCategory::Activations, "inputs");
    Tensor targets = Tensor::empty({mbs, T}, DType::I32, MemCategory::Activations, "targets");
    data::read_samples(*train_data_, ids.data(), mbs, T, inputs.data<int32_t>(), targets.data<int32_t>());
    models::ModelCtx ctx;
    // Megatron's convention: each micro-batch's mean loss, averaged over micro-batches.
    loss += model_->forward(ctx, inputs, targets, true, 1.0f / static_cast<float>(accum)).loss / accum;
    model_->backward(ctx);
  }
  const double grad_norm = optim::global_grad_norm(model_->parameters());
  // The schedule is indexed by the 1-based number of the update being made, so the first
  // update of a warmup already moves the weights.
  const double lr = schedule_.lr_at(step);
  if (std::isfinite(grad_norm)) optimizer_->step(lr, optim::clip_coefficient(grad_norm, cfg_.clip_grad));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double tokens = static_cast<double>(cfg_.global_batch_size * T);
  const double tok_s = tokens / secs;
  const double gflops = tok_s * model_->config().flops_per_token(T) / 1e9;
  rates.push_back(tok_s);
  last_loss_ = loss;
  nlohmann::json rec = {{"step", step},         {"loss", loss},   {"lr", lr},
                        {"grad_norm", grad_norm}, {"tokens_per_s", tok_s}, {"tflops", gflops / 1e3},
                        {"mfu", gflops / peak_gflops_}, {"step_time_s", secs}};
  if (!std::isfinite(grad_norm)) rec["skipped"] = "non-finite gradient";
  metrics_->write(rec);
  if (step % cfg_.log_interval == 0 || step == cfg_.train_iters) {
    const double eta = median(rates) > 0 ? (cfg_.train_iters - step) * tokens / median(rates) : 0;
    std::printf("step %5ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.3f TFLOP/s | MFU %.1f%% | "
                "ETA %s\n",
                step, cfg_.train_iters, loss, lr, grad_norm, tok_s, gflops / 1e3, 100.0 * gflops / peak_gflops_,
                format_duration(eta).c_str());
    std::fflush(stdout);
  }
}

double Trainer::validation_loss() {
  return evaluate(*model_, *valid_data_, cfg_.seq_length, cfg_.micro_batch_size,
                  cfg_.eval_iters > 0 ? cfg_.eval_iters * cfg_.micro_batch_size : 0)
      .loss;
}

void Trainer::save(const std::string& dir) { models::save_hf_model(*model_, dir); }

TrainSummary Trainer::run() {
  fs::create_directories(cfg_.run_dir);
  {
    std::ofstream resolved(fs::path(cfg_.run_dir) / "config.toml");
    resolved << to_toml(cfg_);
  }
  metrics_ = std::make_unique<MetricsLog>((fs::path(cfg_.run_dir) / "metrics.jsonl").string());
  const auto& mc = model_->config();
  std::printf("model %s: %ld layers, hidden %ld, %ld heads (%ld kv), %.2fM parameters | %ld steps of %ld x %ld tokens"
              " | %d threads | sgemm ceiling %.1f GFLOP/s\n",
              mc.name.c_str(), mc.num_layers, mc.hidden_size, mc.num_attention_heads, mc.num_query_groups,
              static_cast<double>(nn::count_parameters(model_->parameters())) / 1e6, cfg_.train_iters,
              cfg_.global_batch_size, cfg_.seq_length, num_threads(), peak_gflops_);
  TrainSummary summary;
  std::vector<double> rates;
  for (int64_t step = 1; step <= cfg_.train_iters; ++step) {
    train_step(step, rates);
    if (valid_data_ && cfg_.eval_interval > 0 && step % cfg_.eval_interval == 0 && step != cfg_.train_iters) {
      const double v = validation_loss();
      metrics_->write({{"step", step}, {"val_loss", v}});
      std::printf("step %5ld | validation loss %.4f\n", step, v);
    }
    if (cfg_.save_interval > 0 && step % cfg_.save_interval == 0) {
      char name[32];
      std::snprintf(name, sizeof name, "step_%06ld", step);
      save((fs::path(cfg_.run_dir) / "checkpoints" / name).string());
    }
  }
  summary.steps = cfg_.train_iters;
  summary.final_loss = last_loss_;
  summary.tokens_per_s = median(rates);
  if (valid_data_) {
    summary.final_val_loss = validation_loss();
    metrics_->write({{"step", cfg_.train_iters}, {"val_loss", summary.final_val_loss}, {"final", true}});
    std::printf("final validation loss %.4f nats/token\n", summary.final_val_loss);
  }
  save((fs::path(cfg_.run_dir) / "final").string());
  std::printf("model saved to %s\n", (fs::path(cfg_.run_dir) / "final").c_str());
  if (cfg_.sample_tokens > 0) {
    auto tok = data::make_tokenizer(cfg_.tokenizer);
    infer::SamplingOptions opts;
    opts.temperature = cfg_.sample_temperature;
    opts.top_k = 40;
    opts.seed = static_cast<uint64_t>(cfg_.seed);
    opts.max_new_tokens = cfg_.sample_tokens;
    opts.stop_token = tok->eod();
    auto prompt = tok->encode(cfg_.sample_prompt.empty() ? "\n" : cfg_.sample_prompt);
    // Positions beyond the training length were never trained (learned position embeddings stay
    // at their init), so the sample stops at seq_length tokens.
    opts.max_new_tokens = std::min<int64_t>(opts.max_new_tokens, cfg_.seq_length - static_cast<int64_t>(prompt.size()));
    auto out = infer::generate(*model_, prompt, opts);
    summary.sample = cfg_.sample_prompt + tok->decode(out);
    std::printf("sample:\n%s\n", summary.sample.c_str());
  }
  return summary;
}

}  // namespace megaton::train
