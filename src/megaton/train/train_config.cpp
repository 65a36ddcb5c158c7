#include "megaton/train/train_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <toml++/toml.h>
#include <variant>

#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"
#include "megaton/data/data_loader.h"
#include "megaton/models/hf_format.h"
#include "megaton/optim/lr_schedule.h"
#include "megaton/pipeline/generators.h"

namespace megaton::train {

namespace {

using Value = std::variant<int64_t, double, bool, std::string>;
enum class Kind { Int, Double, Bool, String };

const char* kind_name(Kind k) {
  static const char* names[] = {"an integer", "a number", "a boolean", "a string"};
  return names[static_cast<int>(k)];
}

// One configuration key: where it lives (TrainConfig or the model) and how to read/write it.
struct Field {
  std::string name;  // "section.key"
  Kind kind;
  bool model;        // applies to TrainConfig::model after the preset / load is resolved
  std::function<void(TrainConfig&, const Value&)> set;
  std::function<Value(const TrainConfig&)> get;
};

template <typename T>
Field field(std::string name, T TrainConfig::*member) {
  Kind kind = std::is_same_v<T, int64_t> ? Kind::Int
              : std::is_same_v<T, double> ? Kind::Double
              : std::is_same_v<T, bool>   ? Kind::Bool
                                          : Kind::String;
  return {std::move(name), kind, false, [member](TrainConfig& c, const Value& v) { c.*member = std::get<T>(v); },
          [member](const TrainConfig& c) { return Value(c.*member); }};
}

template <typename T>
Field model_field(std::string name, T models::TransformerConfig::*member) {
  Field f = field<T>(std::move(name), nullptr);
  f.model = true;
  f.set = [member](TrainConfig& c, const Value& v) { c.model.*member = std::get<T>(v); };
  f.get = [member](const TrainConfig& c) { return Value(c.model.*member); };
  return f;
}

// Keys of a section of the model config, spelled flat as Megatron's arguments: model.num_moe_experts
// is a member of the model's MoeConfig, model.kv_lora_rank of its MlaConfig.
template <auto Section, typename S, typename T>
Field section_field(std::string name, T S::*member) {
  Field f = field<T>(std::move(name), nullptr);
  f.model = true;
  f.set = [member](TrainConfig& c, const Value& v) { (c.model.*Section).*member = std::get<T>(v); };
  f.get = [member](const TrainConfig& c) { return Value((c.model.*Section).*member); };
  return f;
}
template <typename T>
Field moe_field(std::string name, T nn::MoeConfig::*member) {
  return section_field<&models::TransformerConfig::moe>(std::move(name), member);
}
template <typename T>
Field mla_field(std::string name, T nn::MlaConfig::*member) {
  return section_field<&models::TransformerConfig::mla>(std::move(name), member);
}

// Model keys stored as enums, spelled as strings.
template <typename E>
Field model_enum(std::string name, E models::TransformerConfig::*member, E (*parse)(const std::string&),
                 std::string (*print)(E)) {
  Field f{std::move(name), Kind::String, true,
          [member, parse](TrainConfig& c, const Value& v) { c.model.*member = parse(std::get<std::string>(v)); },
          [member, print](const TrainConfig& c) { return Value(print(c.model.*member)); }};
  return f;
}

std::string rope_layout_name(kernels::RopeLayout l) {
  return l == kernels::RopeLayout::Half ? "half" : "interleaved";
}

const std::vector<Field>& fields() {
  using TC = TrainConfig;
  using MC = models::TransformerConfig;
  static const std::vector<Field> all = {
      field("model.preset", &TC::preset),
      field("model.load", &TC::load),
      model_field("model.num_layers", &MC::num_layers),
      model_field("model.hidden_size", &MC::hidden_size),
      model_field("model.num_attention_heads", &MC::num_attention_heads),
      model_field("model.num_query_groups", &MC::num_query_groups),
      model_field("model.kv_channels", &MC::kv_channels),
      model_field("model.ffn_hidden_size", &MC::ffn_hidden_size),
      model_field("model.vocab_size", &MC::vocab_size),
      model_field("model.make_vocab_size_divisible_by", &MC::make_vocab_size_divisible_by),
      model_field("model.max_position_embeddings", &MC::max_position_embeddings),
      model_field("model.attention_type", &MC::attention_type),
      model_field("model.mlp_type", &MC::mlp_type),
      model_field("model.first_k_dense_replace", &MC::first_k_dense_replace),
      model_field("model.mtp_num_layers", &MC::mtp_num_layers),
      model_field("model.mtp_loss_scaling_factor", &MC::mtp_loss_scaling_factor),
      mla_field("model.q_lora_rank", &nn::MlaConfig::q_lora_rank),
      mla_field("model.kv_lora_rank", &nn::MlaConfig::kv_lora_rank),
      mla_field("model.qk_head_dim", &nn::MlaConfig::qk_head_dim),
      mla_field("model.qk_pos_emb_head_dim", &nn::MlaConfig::qk_pos_emb_head_dim),
      mla_field("model.v_head_dim", &nn::MlaConfig::v_head_dim),
      moe_field("model.num_moe_experts", &nn::MoeConfig::num_moe_experts),
      moe_field("model.moe_router_topk", &nn::MoeConfig::moe_router_topk),
      moe_field("model.moe_ffn_hidden_size", &nn::MoeConfig::moe_ffn_hidden_size),
      moe_field("model.moe_shared_expert_intermediate_size", &nn::MoeConfig::moe_shared_expert_intermediate_size),
      moe_field("model.moe_router_score_function", &nn::MoeConfig::moe_router_score_function),
      moe_field("model.moe_router_pre_softmax", &nn::MoeConfig::moe_router_pre_softmax),
      moe_field("model.moe_router_num_groups", &nn::MoeConfig::moe_router_num_groups),
      moe_field("model.moe_router_group_topk", &nn::MoeConfig::moe_router_group_topk),
      moe_field("model.moe_router_norm_topk_prob", &nn::MoeConfig::moe_router_norm_topk_prob),
      moe_field("model.moe_router_topk_scaling_factor", &nn::MoeConfig::moe_router_topk_scaling_factor),
      moe_field("model.moe_router_load_balancing_type", &nn::MoeConfig::moe_router_load_balancing_type),
      moe_field("model.moe_aux_loss_coeff", &nn::MoeConfig::moe_aux_loss_coeff),
      moe_field("model.moe_z_loss_coeff", &nn::MoeConfig::moe_z_loss_coeff),
      moe_field("model.moe_router_enable_expert_bias", &nn::MoeConfig::moe_router_enable_expert_bias),
      moe_field("model.moe_router_bias_update_rate", &nn::MoeConfig::moe_router_bias_update_rate),
      moe_field("model.moe_expert_capacity_factor", &nn::MoeConfig::moe_expert_capacity_factor),
      moe_field("model.moe_token_drop_policy", &nn::MoeConfig::moe_token_drop_policy),
      moe_field("model.moe_token_dispatcher_type", &nn::MoeConfig::moe_token_dispatcher_type),
      moe_field("model.moe_shared_expert_overlap", &nn::MoeConfig::moe_shared_expert_overlap),
      moe_field("model.moe_grouped_gemm", &nn::MoeConfig::moe_grouped_gemm),
      model_enum("model.normalization", &MC::normalization, &models::normalization_from_name,
                 &models::normalization_name),
      model_enum("model.activation", &MC::activation, &models::activation_from_name, &models::activation_name),
      model_enum("model.position_embedding_type", &MC::position_embedding, &models::position_embedding_from_name,
                 &models::position_embedding_name),
      model_enum("model.rope_layout", &MC::rope_layout, &models::rope_layout_from_name, &rope_layout_name),
      model_field("model.rotary_base", &MC::rotary_base),
      model_field("model.add_bias_linear", &MC::add_bias_linear),
      model_field("model.tie_embeddings", &MC::tie_embeddings),
      model_field("model.norm_epsilon", &MC::norm_epsilon),
      model_field("model.init_method_std", &MC::init_method_std),
      field("data.data_path", &TC::data_path),
      field("data.split", &TC::split),
      field("data.valid_data_path", &TC::valid_data_path),
      field("data.data_cache_path", &TC::data_cache_path),
      field("data.tokenizer", &TC::tokenizer),
      field("data.shuffle", &TC::shuffle),
      field("data.num_workers", &TC::num_workers),
      field("training.micro_batch_size", &TC::micro_batch_size),
      field("training.global_batch_size", &TC::global_batch_size),
      field("training.seq_length", &TC::seq_length),
      field("training.train_iters", &TC::train_iters),
      field("training.seed", &TC::seed),
      field("training.threads", &TC::threads),
      field("training.exit_interval", &TC::exit_interval),
      field("training.recompute_granularity", &TC::recompute_granularity),
      field("training.recompute_method", &TC::recompute_method),
      field("training.recompute_num_layers", &TC::recompute_num_layers),
      field("training.recompute_modules", &TC::recompute_modules),
      field("training.bias_activation_fusion", &TC::bias_activation_fusion),
      field("training.residual_norm_fusion", &TC::residual_norm_fusion),
      field("training.layernorm_linear_fusion", &TC::layernorm_linear_fusion),
      field("training.layernorm_mlp_fusion", &TC::layernorm_mlp_fusion),
      field("parallel.tensor_model_parallel_size", &TC::tensor_model_parallel_size),
      field("parallel.pipeline_model_parallel_size", &TC::pipeline_model_parallel_size),
      field("parallel.virtual_pipeline_model_parallel_size", &TC::virtual_pipeline_model_parallel_size),
      field("parallel.pipeline_schedule", &TC::pipeline_schedule),
      field("parallel.decoder_first_pipeline_num_layers", &TC::decoder_first_pipeline_num_layers),
      field("parallel.decoder_last_pipeline_num_layers", &TC::decoder_last_pipeline_num_layers),
      field("parallel.context_parallel_size", &TC::context_parallel_size),
      field("parallel.expert_model_parallel_size", &TC::expert_model_parallel_size),
      field("parallel.expert_tensor_parallel_size", &TC::expert_tensor_parallel_size),
      field("parallel.data_parallel_size", &TC::data_parallel_size),
      field("parallel.sequence_parallel", &TC::sequence_parallel),
      field("parallel.use_distributed_optimizer", &TC::use_distributed_optimizer),
      field("parallel.optimizer_post_validation", &TC::optimizer_post_validation),
      field("parallel.overlap_grad_reduce", &TC::overlap_grad_reduce),
      field("parallel.overlap_param_gather", &TC::overlap_param_gather),
      field("parallel.bucket_size", &TC::bucket_size),
      field("precision.bf16", &TC::bf16),
      field("precision.fp16", &TC::fp16),
      field("precision.loss_scale", &TC::loss_scale),
      field("precision.initial_loss_scale", &TC::initial_loss_scale),
      field("precision.min_loss_scale", &TC::min_loss_scale),
      field("precision.loss_scale_window", &TC::loss_scale_window),
      field("precision.hysteresis", &TC::hysteresis),
      field("precision.fp8", &TC::fp8),
      field("precision.fp8_recipe", &TC::fp8_recipe),
      field("precision.fp8_margin", &TC::fp8_margin),
      field("precision.fp8_amax_history_len", &TC::fp8_amax_history_len),
      field("precision.fp8_amax_compute_algo", &TC::fp8_amax_compute_algo),
      field("precision.first_last_layers_bf16", &TC::first_last_layers_bf16),
      field("precision.num_layers_at_start_in_bf16", &TC::num_layers_at_start_in_bf16),
      field("precision.num_layers_at_end_in_bf16", &TC::num_layers_at_end_in_bf16),
      field("optimizer.lr", &TC::lr),
      field("optimizer.min_lr", &TC::min_lr),
      field("optimizer.lr_warmup_iters", &TC::lr_warmup_iters),
      field("optimizer.lr_decay_iters", &TC::lr_decay_iters),
      field("optimizer.lr_decay_style", &TC::lr_decay_style),
      field("optimizer.weight_decay", &TC::weight_decay),
      field("optimizer.adam_beta1", &TC::adam_beta1),
      field("optimizer.adam_beta2", &TC::adam_beta2),
      field("optimizer.adam_eps", &TC::adam_eps),
      field("optimizer.clip_grad", &TC::clip_grad),
      field("logging.run_dir", &TC::run_dir),
      field("logging.log_interval", &TC::log_interval),
      field("logging.eval_interval", &TC::eval_interval),
      field("logging.trace", &TC::trace),
      field("logging.eval_iters", &TC::eval_iters),
      field("logging.save_interval", &TC::save_interval),
      field("logging.peak_tflops", &TC::peak_tflops),
      field("checkpoint.keep_last", &TC::keep_last),
      field("checkpoint.async_save", &TC::async_save),
      field("checkpoint.write_attempts", &TC::write_attempts),
      field("rewind.enabled", &TC::rewind),
      field("rewind.window", &TC::rewind_window),
      field("rewind.zscore", &TC::rewind_zscore),
      field("rewind.snapshot_interval", &TC::snapshot_interval),
      field("rewind.max_rewinds", &TC::max_rewinds),
      field("rewind.lr_factor", &TC::rewind_lr_factor),
      field("rewind.lr_steps", &TC::rewind_lr_steps),
      field("sample.prompt", &TC::sample_prompt),
      field("sample.tokens", &TC::sample_tokens),
      field("sample.temperature", &TC::sample_temperature),
  };
  return all;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

const Field& find_field(const std::string& name, const std::string& where) {
  for (const Field& f : fields())
    if (f.name == name) return f;
  // Unknown: suggest the nearest (edit distances only now: computing them for every lookup made loading
  // a whole config quadratic in the number of keys).
  const Field* best = nullptr;
  size_t best_d = SIZE_MAX;
  for (const Field& f : fields()) {
    // Compare with and without the section so "training.lr" suggests "optimizer.lr".
    const std::string key = f.name.substr(f.name.find('.') + 1);
    const std::string want = name.substr(name.find('.') + 1);
    size_t d = std::min(edit_distance(f.name, name), edit_distance(key, want));
    if (d < best_d) best_d = d, best = &f;
  }
  fail(where, ": unknown config key '", name, "'", best ? " (did you mean '" + best->name + "'?)" : "");
}

// Read a TOML node as the field's kind; integers are accepted where numbers are expected.
Value from_toml(const toml::node& n, const Field& f, const std::string& where) {
  auto wrong = [&]() -> Value {
    fail(where, ": key '", f.name, "' must be ", kind_name(f.kind), ", got ", n.type());
  };
  switch (f.kind) {
    case Kind::Int:
      if (auto v = n.value_exact<int64_t>()) return *v;
      return wrong();
    case Kind::Double:
      if (auto v = n.value<double>()) return *v;
      return wrong();
    case Kind::Bool:
      if (auto v = n.value_exact<bool>()) return *v;
      return wrong();
    case Kind::String:
      if (auto v = n.value_exact<std::string>()) return *v;
      return wrong();
  }
  return wrong();
}

Value from_text(const std::string& text, const Field& f) {
  // Parse the override as a one-line TOML document so quoting and numbers follow TOML rules;
  // bare words are taken as strings for convenience (--set data.tokenizer=byte).
  try {
    auto doc = toml::parse("v = " + text);
    // A line break would let the text carry more keys after the value: refused, not ignored.
    if (doc.size() != 1) fail("--set ", f.name, "=", text, ": expected one value, got more than one line");
    return from_toml(*doc.get("v"), f, "--set " + f.name + "=" + text);
  } catch (const toml::parse_error&) {
    if (f.kind == Kind::String) return text;
    fail("--set ", f.name, "=", text, ": '", text, "' is not ", kind_name(f.kind));
  }
}

void flatten(const toml::table& t, const std::string& prefix, const std::string& path,
             std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [k, v] : t) {
    std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = v.as_table(); sub && prefix.empty())
      flatten(*sub, name, path, out);
    else
      out.emplace_back(name, &v);
  }
}

void check(bool ok, const std::string& key, const std::string& msg) {
  if (!ok) fail("config key '", key, "': ", msg);
}

// The schedule's sizes (generators.h refuses the rest when the step builds it, naming them) and
// the layer split (pipeline_stage_layers): whole layers, every chunk of a rank as many.
void check_pipeline(const TrainConfig& c) {
  const int64_t vpp = c.virtual_pipeline_model_parallel_size;
  check(vpp >= 1 && vpp <= 1024, "parallel.virtual_pipeline_model_parallel_size",
        "must be in [1, 1024], got " + std::to_string(vpp));
  const auto& kinds = pipeline::schedule_kinds();
  check(c.pipeline_schedule != "none" && std::find(kinds.begin(), kinds.end(), c.pipeline_schedule) != kinds.end(),
        "parallel.pipeline_schedule",
        "'" + c.pipeline_schedule + "' is not one of 1f1b, interleaved, zb-h1, zb-h2, zbv, dualpipe, dualpipev");
  check(vpp == 1 || c.pipeline_schedule == "interleaved", "parallel.virtual_pipeline_model_parallel_size",
        std::to_string(vpp) + " needs parallel.pipeline_schedule = \"interleaved\"");
  pipeline_stage_layers(c);
}

void validate(const TrainConfig& c) {
  // Hyper-parameters must be finite: an inf or NaN lr trains NaN from the first step.
  for (const auto& [key, v] : {std::pair{"optimizer.lr", c.lr}, {"optimizer.min_lr", c.min_lr},
                               {"optimizer.weight_decay", c.weight_decay}, {"optimizer.adam_eps", c.adam_eps},
                               {"optimizer.clip_grad", c.clip_grad}, {"logging.peak_tflops", c.peak_tflops},
                               {"rewind.zscore", c.rewind_zscore}, {"sample.temperature", c.sample_temperature}})
    check(std::isfinite(v), key, "must be a finite number, got " + std::to_string(v));
  // Counts bounded so that the sizes computed from them (samples = steps x batch, batch x sequence)
  // fit in int64 with room to spare.
  constexpr int64_t kMaxCount = int64_t{1} << 31;
  for (const auto& [key, v] : {std::pair{"training.micro_batch_size", c.micro_batch_size},
                               {"training.global_batch_size", c.global_batch_size},
                               {"training.train_iters", c.train_iters}, {"logging.eval_iters", c.eval_iters},
                               {"logging.log_interval", c.log_interval}, {"logging.eval_interval", c.eval_interval},
                               {"logging.save_interval", c.save_interval}, {"training.exit_interval", c.exit_interval},
                               {"sample.tokens", c.sample_tokens}, {"optimizer.lr_warmup_iters", c.lr_warmup_iters},
                               {"optimizer.lr_decay_iters", c.lr_decay_iters}})
    check(v <= kMaxCount, key, "must be at most " + std::to_string(kMaxCount) + ", got " + std::to_string(v));
  check(c.num_workers <= data::DataLoader::kMaxWorkers, "data.num_workers",
        "must be at most " + std::to_string(data::DataLoader::kMaxWorkers) + ", got " + std::to_string(c.num_workers));
  check(c.threads <= 4096, "training.threads", "must be at most 4096, got " + std::to_string(c.threads));
  check(c.sample_temperature >= 0, "sample.temperature", "must not be negative");
  check(c.weight_decay >= 0, "optimizer.weight_decay", "must not be negative");
  check(c.clip_grad >= 0, "optimizer.clip_grad", "must not be negative (0: no clipping)");
  check(c.micro_batch_size > 0, "training.micro_batch_size", "must be positive");
  check(c.global_batch_size > 0 && c.global_batch_size % c.micro_batch_size == 0, "training.global_batch_size",
        "must be a positive multiple of training.micro_batch_size (" + std::to_string(c.micro_batch_size) + ")");
  check(c.seq_length > 0, "training.seq_length", "must be positive");
  check(c.seq_length <= c.model.max_position_embeddings, "training.seq_length",
        std::to_string(c.seq_length) + " exceeds the model's max_position_embeddings " +
            std::to_string(c.model.max_position_embeddings));
  check(c.train_iters >= 0, "training.train_iters", "must not be negative");
  check(c.threads >= 0, "training.threads", "must not be negative");
  check(c.num_workers >= 1, "data.num_workers", "must be at least 1");
  check(c.exit_interval >= 0, "training.exit_interval", "must not be negative");
  check(c.lr >= 0 && c.min_lr >= 0 && c.min_lr <= c.lr, "optimizer.min_lr", "must be in [0, optimizer.lr]");
  check(c.lr_warmup_iters >= 0, "optimizer.lr_warmup_iters", "must not be negative");
  const bool decays = optim::lr_decay_style_from_name(c.lr_decay_style) != optim::LRDecayStyle::Constant;
  check(!decays || c.lr_decay_iters > c.lr_warmup_iters, "optimizer.lr_decay_iters",
        std::to_string(c.lr_decay_iters) + " (train_iters when 0) must exceed optimizer.lr_warmup_iters " +
            std::to_string(c.lr_warmup_iters) + " for lr_decay_style '" + c.lr_decay_style + "'");
  check(c.adam_beta1 >= 0 && c.adam_beta1 < 1, "optimizer.adam_beta1", "must be in [0, 1)");
  check(c.adam_beta2 >= 0 && c.adam_beta2 < 1, "optimizer.adam_beta2", "must be in [0, 1)");
  check(c.adam_eps > 0, "optimizer.adam_eps", "must be positive");
  check(c.log_interval > 0, "logging.log_interval", "must be positive");
  check(c.eval_interval >= 0 && c.eval_iters >= 0, "logging.eval_interval", "eval_interval/eval_iters >= 0");
  check(c.save_interval >= 0, "logging.save_interval", "must not be negative");
  check(!c.run_dir.empty(), "logging.run_dir", "must not be empty");
  check(c.keep_last >= 0, "checkpoint.keep_last", "must not be negative");
  check(c.write_attempts >= 1, "checkpoint.write_attempts", "must be at least 1");
  check(c.rewind_window >= 2, "rewind.window", "must be at least 2 (a standard deviation needs two values)");
  check(c.rewind_zscore > 0, "rewind.zscore", "must be positive");
  check(c.snapshot_interval >= 0, "rewind.snapshot_interval", "must not be negative");
  check(c.max_rewinds >= 0, "rewind.max_rewinds", "must not be negative");
  check(c.rewind_lr_factor > 0 && c.rewind_lr_factor <= 1, "rewind.lr_factor", "must be in (0, 1]");
  check(c.rewind_lr_steps >= 0, "rewind.lr_steps", "must not be negative");
  check(c.sample_tokens >= 0, "sample.tokens", "must not be negative");
  for (const auto& [key, size] : {std::pair{"parallel.tensor_model_parallel_size", c.tensor_model_parallel_size},
                                  {"parallel.pipeline_model_parallel_size", c.pipeline_model_parallel_size},
                                  {"parallel.context_parallel_size", c.context_parallel_size},
                                  {"parallel.expert_model_parallel_size", c.expert_model_parallel_size}}) {
    check(size >= 1 && size <= 1'000'000, key, "must be in [1, 1000000], got " + std::to_string(size));
  }
  check(c.context_parallel_size == 1, "parallel.context_parallel_size",
        std::to_string(c.context_parallel_size) + " is not supported yet (data, tensor, pipeline and expert "
        "parallelism only, for now)");
  if (c.expert_model_parallel_size > 1) {
    const std::string ep = std::to_string(c.expert_model_parallel_size);
    check(c.model.mlp_type == "moe", "parallel.expert_model_parallel_size",
          ep + " needs a mixture-of-experts model (model.mlp_type = \"moe\"), got mlp_type '" + c.model.mlp_type + "'");
    check(c.model.moe.num_moe_experts % c.expert_model_parallel_size == 0, "parallel.expert_model_parallel_size",
          ep + " does not divide model.num_moe_experts " + std::to_string(c.model.moe.num_moe_experts));
  }
  check(c.expert_tensor_parallel_size == 1, "parallel.expert_tensor_parallel_size",
        std::to_string(c.expert_tensor_parallel_size) + " is not supported yet: only 1 (each routed expert whole on "
        "its rank; tensor-parallel ranks split the tokens instead)");
  if (c.model.mlp_type == "moe")
    check(c.micro_batch_size * c.seq_length % c.tensor_model_parallel_size == 0, "training.micro_batch_size",
          "x seq_length (" + std::to_string(c.micro_batch_size * c.seq_length) + " tokens) must split evenly over "
          "tensor_model_parallel_size " + std::to_string(c.tensor_model_parallel_size) + " for the MoE layers");
  check_pipeline(c);
  check(c.data_parallel_size >= 0 && c.data_parallel_size <= 1'000'000, "parallel.data_parallel_size",
        "must be in [0, 1000000] (0: derived from the world size)");
  check(!c.sequence_parallel || c.tensor_model_parallel_size > 1, "parallel.sequence_parallel",
        "needs parallel.tensor_model_parallel_size > 1");
  // Megatron's condition: the sequence splits evenly over the tensor-parallel ranks.
  check(!c.sequence_parallel || c.seq_length % c.tensor_model_parallel_size == 0, "parallel.sequence_parallel",
        "needs training.seq_length " + std::to_string(c.seq_length) + " divisible by tensor_model_parallel_size " +
            std::to_string(c.tensor_model_parallel_size));
  check(!c.overlap_param_gather || c.use_distributed_optimizer, "parallel.overlap_param_gather",
        "needs parallel.use_distributed_optimizer");
  check(!c.optimizer_post_validation || !c.use_distributed_optimizer, "parallel.optimizer_post_validation",
        "is not supported with parallel.use_distributed_optimizer yet (its update all-gathers the weights)");
  check(c.bucket_size >= 1, "parallel.bucket_size", "must be positive");
  if (c.data_parallel_size > 0)
    check(c.global_batch_size % (c.micro_batch_size * c.data_parallel_size) == 0, "training.global_batch_size",
          std::to_string(c.global_batch_size) + " is not a multiple of micro_batch_size x data_parallel_size (" +
              std::to_string(c.micro_batch_size) + " x " + std::to_string(c.data_parallel_size) + ")");
}

// Short names accepted on --set for the [parallel] sizes.
std::string expand_alias(const std::string& key) {
  static const std::pair<const char*, const char*> aliases[] = {
      {"tp", "parallel.tensor_model_parallel_size"}, {"pp", "parallel.pipeline_model_parallel_size"},
      {"cp", "parallel.context_parallel_size"},      {"ep", "parallel.expert_model_parallel_size"},
      {"dp", "parallel.data_parallel_size"}};
  for (const auto& [alias, full] : aliases)
    if (key == alias) return full;
  return key;
}

}  // namespace

std::optional<fp8::Fp8Config> fp8_config(const TrainConfig& c) {
  if (c.fp8.empty()) return std::nullopt;
  // The parsers name the accepted values; the key is added here.
  const auto named = [](const std::string& key, auto&& parse) {
    try {
      return parse();
    } catch (const Error& e) {
      fail("config key '", key, "': ", e.what());
    }
  };
  fp8::Fp8Config f;
  f.hybrid = named("precision.fp8", [&] { return fp8::hybrid_from_format_name(c.fp8); });
  f.recipe = named("precision.fp8_recipe", [&] { return fp8::recipe_from_name(c.fp8_recipe); });
  f.delayed.algo = named("precision.fp8_amax_compute_algo", [&] { return fp8::amax_algo_from_name(c.fp8_amax_compute_algo); });
  check(c.fp8_margin >= 0 && c.fp8_margin <= 64, "precision.fp8_margin", "must be in [0, 64], got " + std::to_string(c.fp8_margin));
  check(c.fp8_amax_history_len >= 1 && c.fp8_amax_history_len <= 65536, "precision.fp8_amax_history_len",
        "must be in [1, 65536], got " + std::to_string(c.fp8_amax_history_len));
  f.delayed.margin = static_cast<int>(c.fp8_margin);
  f.delayed.history_len = static_cast<int>(c.fp8_amax_history_len);
  return f;
}

std::optional<optim::LossScalerConfig> loss_scaler_config(const TrainConfig& c) {
  if (!c.fp16) return std::nullopt;
  check(!c.bf16, "precision.fp16", "and precision.bf16 are both set; choose one 16-bit format");
  check(c.fp8.empty(), "precision.fp16", "with precision.fp8 is not supported yet (FP8 runs on bf16 compute)");
  // Checked here, before the narrowing to LossScalerConfig's int (its validate() checks the rest).
  check(c.hysteresis >= 1 && c.hysteresis <= 1000000, "precision.hysteresis",
        "must be in [1, 1000000], got " + std::to_string(c.hysteresis));
  optim::LossScalerConfig s;
  if (c.loss_scale != 0.0) s.fixed_scale = c.loss_scale;
  s.initial_scale = c.initial_loss_scale;
  s.min_scale = c.min_loss_scale;
  s.window = c.loss_scale_window;
  s.hysteresis = static_cast<int>(c.hysteresis);
  try {
    s.validate();
  } catch (const Error& e) {
    fail("config key ", e.what());
  }
  return s;
}

std::pair<int64_t, int64_t> fp8_layer_range(const TrainConfig& c, int64_t num_layers) {
  if (!c.first_last_layers_bf16) return {0, num_layers};
  const int64_t start = c.num_layers_at_start_in_bf16, end = c.num_layers_at_end_in_bf16;
  for (const auto& [key, n] : {std::pair{"precision.num_layers_at_start_in_bf16", start},
                               std::pair{"precision.num_layers_at_end_in_bf16", end}})
    check(n >= 0 && n <= num_layers, key, "must be in [0, " + std::to_string(num_layers) + "] (model.num_layers), got " +
                                              std::to_string(n));
  check(start + end < num_layers, "precision.first_last_layers_bf16",
        std::to_string(start) + " + " + std::to_string(end) + " layers kept in the compute dtype leave none of the " +
            std::to_string(num_layers) + " in FP8 (turn precision.fp8 off instead)");
  return {start, num_layers - end};
}

std::vector<std::string> train_config_keys() {
  std::vector<std::string> names;
  for (const Field& f : fields()) names.push_back(f.name);
  return names;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  // Collect (field, value) in order: file first, then --set, so later settings win.
  std::vector<std::pair<const Field*, Value>> settings;
  toml::table doc;
  if (!path.empty()) {
    try {
      doc = toml::parse(read_regular_file(path, "config file"), path);
    } catch (const toml::parse_error& e) {
      std::ostringstream os;
      os << path << ":" << e.source().begin.line << ": " << e.description();
      throw Error(os.str());
    }
    std::vector<std::pair<std::string, const toml::node*>> flat;
    flatten(doc, "", path, flat);
    for (const auto& [name, node] : flat) {
      const Field& f = find_field(name, path);
      settings.emplace_back(&f, from_toml(*node, f, path));
    }
  }
  for (const std::string& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos) fail("--set '", o, "': expected section.key=value");
    const Field& f = find_field(expand_alias(o.substr(0, eq)), "--set");
    settings.emplace_back(&f, from_text(o.substr(eq + 1), f));
  }

  TrainConfig c;
  for (const auto& [f, v] : settings)
    if (!f->model) f->set(c, v);
  if (!c.load.empty()) {
    c.model = models::load_hf_config(c.load);
    c.preset = "";
  } else {
    c.model = models::preset(c.preset);
  }
  for (const auto& [f, v] : settings) {
    if (!f->model) continue;
    if (!c.load.empty()) fail("config key '", f->name, "' cannot be combined with model.load (the architecture comes from ", c.load, ")");
    f->set(c, v);
    c.model.name = "custom";
  }
  if (c.lr_decay_iters == 0) c.lr_decay_iters = c.train_iters;
  c.model.validate();
  validate(c);
  // An unknown recipe or format, or bad bf16 layer counts, fail here, before any file is opened
  // (a loaded model's layers are counted when it is loaded).
  if (fp8_config(c) && c.load.empty()) fp8_layer_range(c, c.model.num_layers);
  loss_scaler_config(c);
  recompute_config(c);
  return c;
}

nn::RecomputeConfig recompute_config(const TrainConfig& c) {
  return nn::recompute_config_from_names(c.recompute_granularity, c.recompute_method, c.recompute_num_layers,
                                         c.recompute_modules, "config key training.");
}

int64_t pipeline_chunks_per_rank(const TrainConfig& c) {
  // The V: stages r and 2p-1-r; DualPipe: stage r of one copy and p-1-r of the other.
  if (c.pipeline_schedule == "zbv" || c.pipeline_schedule == "dualpipev" || c.pipeline_schedule == "dualpipe") return 2;
  return c.pipeline_schedule == "interleaved" ? c.virtual_pipeline_model_parallel_size : 1;
}

std::vector<int64_t> pipeline_stage_layers(const TrainConfig& c) {
  // Model chunks per rank and copy: DualPipe's two chunks per rank are one stage of each copy.
  const int64_t pp = c.pipeline_model_parallel_size, L = c.model.num_layers,
                per_rank = c.pipeline_schedule == "dualpipe" ? 1 : pipeline_chunks_per_rank(c);
  const int64_t first = c.decoder_first_pipeline_num_layers, last = c.decoder_last_pipeline_num_layers;
  for (const auto& [key, n] : {std::pair{"parallel.decoder_first_pipeline_num_layers", first},
                               {"parallel.decoder_last_pipeline_num_layers", last}}) {
    check(n >= 0 && n <= L, key, "must be in [0, model.num_layers " + std::to_string(L) + "] (0: not set), got " +
                                     std::to_string(n));
    check(n == 0 || pp > 1, key, std::to_string(n) + " needs parallel.pipeline_model_parallel_size > 1");
  }
  if (pp == 1) return {L};
  if (first == 0 && last == 0) {
    const int64_t chunks = pp * per_rank;
    check(L % chunks == 0, "model.num_layers",
          std::to_string(L) + " layers do not split evenly into " + std::to_string(chunks) +
              " pipeline model chunks (pipeline_model_parallel_size " + std::to_string(pp) + " x " +
              std::to_string(per_rank) + " chunks per rank for '" + c.pipeline_schedule + "')");
    return std::vector<int64_t>(static_cast<size_t>(pp), L / pp);
  }
  // Megatron's rule: the ranks not given a count share the remaining layers evenly.
  const std::string key = first ? "parallel.decoder_first_pipeline_num_layers" : "parallel.decoder_last_pipeline_num_layers";
  const std::string given = (first ? "decoder_first_pipeline_num_layers " + std::to_string(first) : std::string()) +
                            (first && last ? " + " : "") +
                            (last ? "decoder_last_pipeline_num_layers " + std::to_string(last) : std::string());
  const int64_t rest = L - first - last, others = pp - (first ? 1 : 0) - (last ? 1 : 0);
  check(rest >= 0, key, given + " exceed model.num_layers " + std::to_string(L));
  check(others > 0 || rest == 0, key,
        given + " leave " + std::to_string(rest) + " of model.num_layers " + std::to_string(L) +
            " layers but no other pipeline rank (pipeline_model_parallel_size " + std::to_string(pp) + ")");
  check(others == 0 || rest > 0, key,
        given + " leave no layers of model.num_layers " + std::to_string(L) + " for the other " +
            std::to_string(others) + " pipeline ranks (each needs at least one)");
  check(others == 0 || rest % others == 0, key,
        given + " leave " + std::to_string(rest) + " of model.num_layers " + std::to_string(L) +
            " layers, which do not split evenly into the other " + std::to_string(others) + " pipeline ranks");
  std::vector<int64_t> layers(static_cast<size_t>(pp), others ? rest / others : 0);
  if (first) layers.front() = first;
  if (last) layers.back() = last;
  for (size_t r = 0; r < layers.size(); ++r)
    check(layers[r] % per_rank == 0, key,
          "pipeline rank " + std::to_string(r) + "'s " + std::to_string(layers[r]) + " layers do not split evenly into " +
              std::to_string(per_rank) + " chunks per rank for '" + c.pipeline_schedule + "'");
  return layers;
}

void resolve_parallel_layout(TrainConfig& c, int64_t world_size) {
  const int64_t model_parallel = c.tensor_model_parallel_size * c.context_parallel_size * c.pipeline_model_parallel_size;
  if (world_size < 1 || world_size % model_parallel != 0)
    fail("world size ", world_size, " is not divisible by tensor_model_parallel_size ", c.tensor_model_parallel_size,
         " x context_parallel_size ", c.context_parallel_size, " x pipeline_model_parallel_size ",
         c.pipeline_model_parallel_size);
  const int64_t dp = world_size / model_parallel;
  check(c.data_parallel_size == 0 || c.data_parallel_size == dp, "parallel.data_parallel_size",
        std::to_string(c.data_parallel_size) + " does not match the world: " + std::to_string(world_size) +
            " processes / " + std::to_string(model_parallel) + " model-parallel = " + std::to_string(dp));
  check(c.global_batch_size % (c.micro_batch_size * dp) == 0, "training.global_batch_size",
        std::to_string(c.global_batch_size) + " is not a multiple of micro_batch_size x data-parallel size (" +
            std::to_string(c.micro_batch_size) + " x " + std::to_string(dp) + ")");
  const int64_t stage = c.tensor_model_parallel_size * c.context_parallel_size * dp;
  check(stage % c.expert_model_parallel_size == 0, "parallel.expert_model_parallel_size",
        std::to_string(c.expert_model_parallel_size) + " does not divide the " + std::to_string(stage) +
            " ranks of a pipeline stage (tensor x context x data parallel)");
  c.data_parallel_size = dp;
}

std::string to_toml(const TrainConfig& c) {
  std::ostringstream os;
  std::string section;
  for (const Field& f : fields()) {
    // With model.load the architecture comes from the HF folder; writing it out again would
    // make the resolved file unloadable (model keys cannot be combined with load).
    if (f.model && !c.load.empty()) continue;
    const std::string s = f.name.substr(0, f.name.find('.'));
    if (s != section) os << (section.empty() ? "" : "\n") << "[" << s << "]\n", section = s;
    os << f.name.substr(s.size() + 1) << " = ";
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>)
            os << toml::value<std::string>(v);
          else if constexpr (std::is_same_v<T, bool>)
            os << (v ? "true" : "false");
          else if constexpr (std::is_same_v<T, double>)
            os << toml::value<double>(v);
          else
            os << v;
        },
        f.get(c));
    os << "\n";
  }
  return os.str();
}

}  // namespace megaton::train
