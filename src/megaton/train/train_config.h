// Everything `megaton train` reads from its TOML file and --set overrides. Keys are grouped in
// sections ([model], [data], [training], [parallel], [precision], [optimizer], [logging], [checkpoint], [rewind], [sample]) and named after
// Megatron-LM's arguments. Unknown keys, wrong types and inconsistent values are errors that
// name the key (and suggest the nearest known one).
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megaton/fp8/recipe.h"
#include "megaton/optim/loss_scaler.h"
#include "megaton/models/transformer_config.h"
#include "megaton/nn/recompute.h"

namespace megaton::train {

struct TrainConfig {
  // [model]: a preset plus optional overrides, or `load` = an HF folder to start from.
  std::string preset = "gpt-tiny";
  std::string load;
  models::TransformerConfig model;  // resolved from preset/load and overrides

  // [data]
  // Megatron's --data-path: one dataset prefix (PREFIX.bin / PREFIX.idx) or a weighted blend
  // "0.7 web 0.3 code", sampled like Megatron's GPTDataset / BlendedDataset.
  std::string data_path;
  std::string split = "969,30,1";  // train,valid,test document ratios of each dataset
  // Validation prefix scored in stream order; empty: the split's validation part (if any).
  std::string valid_data_path;
  std::string data_cache_path;     // where sample indices are cached; empty: next to the data
  std::string tokenizer = "byte";
  // false: no sampling at all; step s reads samples s*B .. of one dataset's concatenated token
  // stream, in order (sample i = tokens [i*T, i*T + T]), wrapping around at its end.
  bool shuffle = true;
  int64_t num_workers = 2;         // loader threads reading ahead of the trainer

  // [training]
  int64_t micro_batch_size = 16;
  int64_t global_batch_size = 16;  // = micro_batch_size x gradient accumulation steps
  int64_t seq_length = 128;
  int64_t train_iters = 100;
  int64_t seed = 1234;
  int64_t threads = 0;  // 0: OMP_NUM_THREADS or all cores
  // Activation recompute (Megatron's --recompute-*, nn/recompute.h): granularity "" (off), "full" or
  // "selective"; full's method "uniform" | "block" and num_layers; selective's modules, a comma- or
  // space-separated list of core_attn, mlp, layernorm.
  std::string recompute_granularity;
  std::string recompute_method = "uniform";
  int64_t recompute_num_layers = 1;
  std::string recompute_modules = "core_attn";
  // Fused kernels (nn/fusion.h; Megatron's bias_activation_fusion, on by default as there).
  bool bias_activation_fusion = true;
  bool residual_norm_fusion = true;
  bool layernorm_linear_fusion = true;  // TE's LayerNormLinear / RMSNormLinear (FP8 only changes)
  bool layernorm_mlp_fusion = true;     // TE's LayerNormMLP's activation + cast (FP8 only changes)

  // [parallel]: Megatron's names. The world is tp x cp x dp x pp processes (rank order tp fastest);
  // dp is derived from the world size. `--set tp=2` (also pp, cp, ep, dp) is short for these keys.
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  // Model chunks per pipeline rank for the interleaved schedule (Megatron's
  // --num-layers-per-virtual-pipeline-stage, given as a count): 1, or > 1 with "interleaved".
  int64_t virtual_pipeline_model_parallel_size = 1;
  // The op list every pipeline rank runs (pipeline/generators.h kinds): "1f1b", "interleaved",
  // "zb-h1", "zb-h2", "zbv", "dualpipev" ("dualpipe", with its two parameter copies, is refused
  // for now). At pipeline_model_parallel_size 1 the step runs without pipelining whatever is set.
  std::string pipeline_schedule = "1f1b";
  // Megatron's uneven first / last stages (to balance the embedding and the head): the layers of
  // pipeline rank 0 / of the last rank; the other ranks split the rest evenly. 0: not set.
  int64_t decoder_first_pipeline_num_layers = 0;
  int64_t decoder_last_pipeline_num_layers = 0;
  int64_t context_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  // Megatron's expert_tensor_parallel_size: 1 alone for now (each routed expert whole on its rank;
  // under tensor parallelism the tensor-parallel ranks split the tokens, as DeepSeek-V3 trains).
  int64_t expert_tensor_parallel_size = 1;
  int64_t data_parallel_size = 0;      // 0: world size / (tp x cp x pp); else checked against it
  bool sequence_parallel = false;      // needs tp > 1
  bool use_distributed_optimizer = false;
  // Zero Bubble's optimizer post-validation (train/step_undo.h): each stage steps as soon as its
  // gradients are final, before the pipeline-wide grad norm, and undoes the step where clipping or
  // the inf/NaN check would have changed it. Meant for zb-h2 / zbv; off by default; not with the
  // distributed optimizer.
  bool optimizer_post_validation = false;
  bool overlap_grad_reduce = true;     // reduce each gradient bucket as soon as backward finishes it
  bool overlap_param_gather = false;
  int64_t bucket_size = 40'000'000;    // elements per gradient bucket (Megatron's --ddp-bucket-size)

  // [precision]: Megatron's --bf16: bf16 activations and GEMMs (fp32 accumulation), fp32 main
  // weights, gradients and optimizer state, norms and softmax statistics in fp32.
  bool bf16 = false;
  // Megatron's --fp16: fp16 activations and GEMMs (fp32 accumulation and main weights), with loss
  // scaling (optim/loss_scaler.h): loss_scale 0 = dynamic from initial_loss_scale (halved after
  // `hysteresis` overflowing steps, which are skipped; doubled after loss_scale_window clean ones,
  // never below min_loss_scale), else that fixed scale.
  bool fp16 = false;
  double loss_scale = 0.0;
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  // FP8 GEMMs in the transformer layers' linears (Megatron's --fp8-format / --fp8-recipe / ...,
  // fp8/recipe.h): fp8 = "" (off), "e4m3" or "hybrid"; the embedding and output head stay in the
  // compute dtype, as TransformerEngine and DeepSeek-V3 keep them.
  std::string fp8;
  std::string fp8_recipe = "delayed";
  int64_t fp8_margin = 0;
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";
  // Megatron's --first-last-layers-bf16: the first / last layers' linears stay in the compute
  // dtype (the layers nearest the embedding and the loss are the most sensitive to FP8 rounding).
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  int64_t exit_interval = 0;  // stop (after saving a checkpoint) once step % exit_interval == 0; 0: never

  // [optimizer]
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;  // 0: train_iters
  std::string lr_decay_style = "cosine";
  double weight_decay = 0.1;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;

  // [logging]
  std::string run_dir = "runs/latest";
  int64_t log_interval = 10;
  int64_t eval_interval = 0;  // 0: only at the end
  bool trace = false;         // RUN/trace.json: a Chrome trace of every rank's measured pipeline ops
  int64_t eval_iters = 20;    // validation batches per evaluation (0: the whole split)
  int64_t save_interval = 0;  // 0: only the final export
  double peak_tflops = 0.0;   // for MFU; 0: measured sgemm ceiling of this machine

  // [checkpoint]: RUN/checkpoints/step_N/ every logging.save_interval steps and at the end
  int64_t keep_last = 3;       // checkpoints kept (older ones removed); 0: all
  bool async_save = true;      // write in a background thread; the step pays only for a copy
  int64_t write_attempts = 3;  // a failing write is retried this often before training stops

  // [rewind]: on a NaN/Inf or a loss / grad-norm spike, restore the last good state, skip the
  // offending batch and go on
  bool rewind = false;
  int64_t rewind_window = 50;       // steps in the sliding window; spikes are judged once it is full
  double rewind_zscore = 6.0;       // a loss or grad norm this many standard deviations above the mean
  int64_t snapshot_interval = 10;   // in-memory snapshot every this many steps; 0: rewind to the last checkpoint
  int64_t max_rewinds = 3;          // more anomalies than this stop training with an error
  double rewind_lr_factor = 1.0;    // lr multiplier for rewind_lr_steps steps from the skipped one on
  int64_t rewind_lr_steps = 0;

  // [sample]: text generated at the end of training
  std::string sample_prompt = "";
  int64_t sample_tokens = 0;
  double sample_temperature = 0.8;

  // Micro-batches per step on each data-parallel rank (data_parallel_size resolved: see
  // resolve_parallel_layout).
  int64_t grad_accum_steps() const {
    return global_batch_size / (micro_batch_size * std::max<int64_t>(1, data_parallel_size));
  }
};

// Parse `path` (empty: defaults only) then apply "section.key=value" overrides. model is
// resolved and everything validated; data files are not opened here.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);
// The fully resolved configuration as TOML (written to the run directory).
std::string to_toml(const TrainConfig& c);
// Fixes data_parallel_size for a world of `world_size` processes: world / (tp x cp x pp), which must
// divide exactly and match a data_parallel_size given in the config; the global batch must split
// into whole micro-batches on every data-parallel rank. Errors name the keys and sizes.
void resolve_parallel_layout(TrainConfig& c, int64_t world_size);
// The FP8 recipe of [precision] (nullopt when fp8 is off); errors name the key.
std::optional<fp8::Fp8Config> fp8_config(const TrainConfig& c);
// The activation recompute of [training]; errors name the key.
nn::RecomputeConfig recompute_config(const TrainConfig& c);
// The loss scaling of [precision] fp16 (nullopt without fp16); errors name the key.
std::optional<optim::LossScalerConfig> loss_scaler_config(const TrainConfig& c);
// The transformer layers [first, end) whose linears run in FP8 in a model of num_layers: all, or
// all but the first / last num_layers_at_{start,end}_in_bf16 under first_last_layers_bf16; errors
// name the keys (at least one layer must stay in FP8).
std::pair<int64_t, int64_t> fp8_layer_range(const TrainConfig& c, int64_t num_layers);
// Model chunks each pipeline rank holds under c.pipeline_schedule: 2 for the V schedules (zbv,
// dualpipev) and dualpipe (one per copy), virtual_pipeline_model_parallel_size for interleaved,
// else 1.
int64_t pipeline_chunks_per_rank(const TrainConfig& c);
// The layers of each pipeline rank: even, or with decoder_first / last_pipeline_num_layers. Throws
// naming the key and the sizes when they do not add up (each rank's layers must also split evenly
// into its chunks).
std::vector<int64_t> pipeline_stage_layers(const TrainConfig& c);
// All known "section.key" names (for help and suggestions).
std::vector<std::string> train_config_keys();

}  // namespace megaton::train
