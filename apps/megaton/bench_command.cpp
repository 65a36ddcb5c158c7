#include <algorithm>
#include <array>
#include <iterator>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "batch_decode_bench.h"
#include "fusion_kernels.h"
#include "attention_bench.h"
#include "gemm_shapes.h"
#include "option_range.h"
#include "megaton/core/allocator.h"
#include "megaton/core/cpu_info.h"
#include "megaton/core/rng.h"
#include "megaton/core/threads.h"
#include "megaton/fp8/recipe.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/sgemm_ceiling.h"
#include "megaton/models/transformer_model.h"
#include "megaton/optim/adamw.h"
#include "megaton/optim/grad_clip.h"

namespace megaton::app {

namespace {

// The phases of a timed step, in order; their medians tell where a step's time goes.
constexpr const char* kPhases[] = {"zero_grads", "refresh_weights", "forward", "backward", "grad_norm", "optimizer"};
constexpr size_t kNumPhases = std::size(kPhases);

double median_of(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<int64_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct BenchResult {
  double step_s, tokens_per_s, gflops, sgemm_gflops;
  std::array<double, kNumPhases> phase_s;  // median seconds of each phase
  double gemm_ceiling_gflops;  // square GEMMs in the compute dtype (= sgemm_gflops in fp32)
  MemStats memory;  // peak bytes per category over the timed steps
};

// What --precision names: the compute dtype and, for the FP8 ones, the recipe of the layers'
// linears (on bf16 compute, as Megatron's --fp8 runs on --bf16; the formats are TE's defaults per
// recipe: hybrid for the per-tensor scalings, E4M3 for DeepSeek-V3's blocks and MXFP8).
struct Precision {
  DType compute;
  std::optional<fp8::Fp8Config> fp8;
};

Precision precision_from_name(const std::string& name) {
  if (name == "fp32") return {DType::F32, std::nullopt};
  if (name == "bf16") return {DType::BF16, std::nullopt};
  if (name == "fp16") return {DType::F16, std::nullopt};
  fp8::Fp8Config f;
  f.recipe = fp8::recipe_from_name(name == "mxfp8" ? "mxfp8" : name.substr(name.find('-') + 1));
  f.hybrid = f.recipe == fp8::Recipe::Delayed || f.recipe == fp8::Recipe::Tensorwise;
  return {DType::BF16, f};
}

// fp16 steps scale the loss and divide the fp32 main gradients by the scale before the norm, as a
// training step does (a fixed 2^16 here: the dynamic scaler's bookkeeping costs nothing measurable).
constexpr float kFp16LossScale = 65536.0f;

void unscale_gradients(const nn::ParameterList& params) {
  for (nn::Parameter* p : params) {
    float* g = p->grad.data<float>();
    const int64_t n = p->grad.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] *= 1.0f / kFp16LossScale;
  }
}

// Full training steps (forward, backward, clip, AdamW) on random tokens; median step time.
BenchResult run_bench(const models::TransformerConfig& config, int64_t B, int64_t T, int steps,
                      const Precision& precision, const nn::RecomputeConfig& recompute, const nn::FusionConfig& fusion) {
  models::TransformerModel model(config);
  model.init_weights(1);
  model.set_compute_dtype(precision.compute);
  if (precision.fp8) model.enable_fp8(*precision.fp8);
  model.set_recompute(recompute);
  model.set_fusion(fusion);
  optim::AdamW opt(model.parameters(), {});
  Tensor inputs = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "inputs");
  Tensor targets = Tensor::empty({B, T}, DType::I32, MemCategory::Activations, "targets");
  Philox rng(7);
  const auto V = static_cast<double>(model.config().vocab_size);
  for (int64_t i = 0; i < B * T; ++i) {
    inputs.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform_double(2 * i) * V - 0.5);
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform_double(2 * i + 1) * V - 0.5);
  }
  std::vector<double> times;
  std::array<std::vector<double>, kNumPhases> phase_times;
  // Step 0 warms up caches and the allocator, and is delayed FP8 scaling's calibration step (its
  // linears unquantised): the peaks are those of the timed steps.
  for (int s = 0; s < steps + 1; ++s) {
    if (s == 1) Allocator::host().reset_peaks();
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    size_t phase = 0;
    const auto phase_done = [&] {  // closes the current phase
      const auto now = std::chrono::steady_clock::now();
      if (s > 0) phase_times[phase].push_back(std::chrono::duration<double>(now - last).count());
      last = now;
      ++phase;
    };
    nn::zero_grads(model.parameters());
    phase_done();
    model.refresh_compute_weights();  // as a training step does after the optimizer's update
    for (fp8::LinearQuantizer* q : model.fp8_quantizers()) q->next_step();  // delayed scales roll per step
    phase_done();
    models::ModelCtx ctx;
    const bool fp16 = precision.compute == DType::F16;
    model.forward(ctx, inputs, targets, true, fp16 ? kFp16LossScale : 1.0f);
    phase_done();
    model.backward(ctx);
    if (fp16) unscale_gradients(model.parameters());
    phase_done();
    const double clip = optim::clip_coefficient(optim::global_grad_norm(model.parameters()), 1.0);
    phase_done();
    opt.step(1e-4, clip);
    phase_done();
    if (s > 0) times.push_back(std::chrono::duration<double>(last - t0).count());
  }
  BenchResult r;
  r.memory = Allocator::host().stats();
  r.step_s = median_of(times);
  for (size_t p = 0; p < kNumPhases; ++p) r.phase_s[p] = median_of(phase_times[p]);
  r.tokens_per_s = static_cast<double>(B * T) / r.step_s;
  r.gflops = r.tokens_per_s * model.config().flops_per_token(T) / 1e9;
  r.sgemm_gflops = kernels::measure_sgemm_gflops();
  r.gemm_ceiling_gflops =
      precision.compute == DType::F32 ? r.sgemm_gflops : gemm_ceiling_gflops(Device::cpu(), precision.compute);
  return r;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Time training steps of a preset; report tokens/s, achieved GFLOP/s and "
                                          "the ratio to this machine's measured sgemm ceiling");
  static std::string preset = "gpt2-124m";
  static int64_t layers = 0;  // 0: the preset's
  static int64_t batch_requests = 0;
  static int64_t batch = 4, seq_len = 256;
  static int steps = 5, threads = 0;
  static bool json = false, gemm_shapes = false, attention = false, fusion_kernels = false, cpu_only = false;
  static std::string device_name = "cpu", dtype_text = "f32", cpu_gemm = "auto", precision = "fp32",
                     kv_dtype_text = "f32";
  static std::string recompute = "none", recompute_modules = "core_attn", fusion = "on";
  cmd->add_option("--model", preset, "Model preset")->capture_default_str();
  cmd->add_option("--layers", layers,
                  "Decoder layers instead of the preset's (a large model's shape at a size this machine trains)")
      ->check(in_range<int64_t>(1, 1 << 16));
  cmd->add_option("--batch", batch, "Batch size")->capture_default_str()->check(in_range<int64_t>(1, 1 << 20));
  cmd->add_option("--seq-len", seq_len, "Sequence length")->capture_default_str()->check(in_range<int64_t>(1, 1 << 24));
  cmd->add_option("--steps", steps, "Timed steps (median reported)")->capture_default_str()->check(in_range(1, 1 << 20));
  cmd->add_option("--threads", threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")->check(in_range(0, 4096));
  cmd->add_flag("--json", json, "Print one JSON line");
  cmd->add_flag("--gemm-shapes", gemm_shapes,
                "Instead of training steps, time each linear's forward / dgrad / wgrad GEMM at batch x seq-len rows");
  cmd->add_flag("--attention", attention,
                "Instead of training steps, time the causal attention kernel forward and backward at the preset's "
                "heads and head dims, batch x seq-len (FlashAttention's FLOP count; --device, --dtype)");
  cmd->add_flag("--fusion-kernels", fusion_kernels,
                "Instead of training steps, time each fused kernel (bias + activation, residual add + norm, forward "
                "and backward) against the unfused kernels it replaces, at one layer's shapes of batch x seq-len rows "
                "(cpu; --dtype f32 or bf16)");
  cmd->add_option("--device", device_name, "With --gemm-shapes or --attention: cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", dtype_text,
                  "With --gemm-shapes: f32, bf16, or FP8 next to bf16 (fp8-tensorwise: per-tensor scales, E5M2 "
                  "gradients; fp8-blockwise: 1x128 / 128x128 E4M3); with --attention: f32 or bf16, or on cuda f16; "
                  "with --fusion-kernels: f32 or bf16")
      ->capture_default_str();
  cmd->add_option("--cpu-gemm", cpu_gemm,
                  "The library of the CPU GEMMs: auto (OpenBLAS for f32; oneDNN for bf16 where the CPU has native "
                  "bf16, else OpenBLAS on f32 copies), openblas or onednn")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "openblas", "onednn"}));
  cmd->add_option("--precision", precision,
                  "Training steps in fp32, bf16 or fp16 mixed precision (Megatron's --bf16 / --fp16, the fp16 loss scaled by 2^16), or bf16 with the layers' linears in "
                  "FP8 under a recipe (fp8-delayed and fp8-tensorwise: E4M3 forward, E5M2 gradients; fp8-blockwise: "
                  "DeepSeek-V3's 1x128 / 128x128 E4M3; mxfp8: 1x32 blocks with E8M0 scales)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8"}));
  cmd->add_option("--recompute", recompute,
                  "Activation recompute (Megatron's --recompute-granularity): none, full (every layer recomputed "
                  "on its own: method uniform, 1 layer) or selective (the --recompute-modules)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "full", "selective"}));
  cmd->add_option("--recompute-modules", recompute_modules,
                  "With --recompute selective: comma-separated core_attn, mlp, layernorm, moe_act")
      ->capture_default_str();
  cmd->add_option("--fusion", fusion,
                  "Fused kernels (bias + activation, residual add + norm, and under FP8 the norm -> linear and "
                  "activation -> fc2 casts; training.bias_activation_fusion, residual_norm_fusion, "
                  "layernorm_linear_fusion, layernorm_mlp_fusion): on, off, or one of them alone (bias-act, "
                  "residual-norm, norm-linear, mlp-cast)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off", "bias-act", "residual-norm", "norm-linear", "mlp-cast"}));
  cmd->add_option("--continuous-batching", batch_requests,
                  "Serve this many requests (--seq-len prompt tokens, --steps new tokens each, greedy) by continuous "
                  "batching and one after another, side by side: aggregate tokens/s of each (--dtype f32 or bf16)")
      ->check(in_range<int64_t>(1, 4096));
  cmd->add_option("--kv-cache-dtype", kv_dtype_text, "With --continuous-batching: the batcher's KV pages, f32, bf16 or fp8")
      ->capture_default_str();
  cmd->add_flag("--cpu-info", cpu_only, "Only print the CPU line (model, features, threads) every benchmark starts with");
  cmd->callback([] {
    set_num_threads(threads);
    if (cpu_gemm != "auto")
      kernels::cpu::force_gemm_library(cpu_gemm == "onednn" ? kernels::cpu::GemmLibrary::OneDnn
                                                            : kernels::cpu::GemmLibrary::OpenBlas);
    const CpuInfo cpu = cpu_info();
    if (!json || cpu_only) std::printf("cpu: %s, %d threads\n", describe(cpu).c_str(), num_threads());
    if (cpu_only) return;
    if (gemm_shapes) {
      const Device device = Device::parse(device_name);
      if (dtype_text == "fp8-tensorwise" || dtype_text == "fp8-blockwise") {
        print_fp8_gemm_shapes(models::preset(preset), batch * seq_len, steps, json, device, dtype_text == "fp8-blockwise");
        return;
      }
      const DType dtype = dtype_from_name(dtype_text);
      if (device.is_cpu() && dtype != DType::F32 && dtype != DType::BF16)
        fail("--dtype ", dtype_text, " on the cpu: the CPU GEMMs run f32 or bf16");
      print_gemm_shapes(models::preset(preset), batch * seq_len, steps, json, device, dtype);
      return;
    }
    if (attention) {
      print_attention_bench(models::preset(preset), batch, seq_len, steps, json, Device::parse(device_name),
                            dtype_from_name(dtype_text));
      return;
    }
    if (batch_requests > 0) {
      models::TransformerConfig config = models::preset(preset);
      if (layers > 0) config.num_layers = layers;
      const DType dtype = dtype_from_name(dtype_text);
      if (dtype != DType::F32 && dtype != DType::BF16) fail("--continuous-batching --dtype ", dtype_text, ": f32 or bf16");
      if (kv_dtype_text != "f32" && kv_dtype_text != "bf16" && kv_dtype_text != "fp8")
        fail("--kv-cache-dtype ", kv_dtype_text, ": f32, bf16 or fp8");
      const DType kv = kv_dtype_text == "fp8" ? DType::F8E4M3 : dtype_from_name(kv_dtype_text);
      print_batch_decode(config, batch_requests, seq_len, steps, dtype, kv, json);
      return;
    }
    if (fusion_kernels) {
      const DType dtype = dtype_from_name(dtype_text);
      if (dtype != DType::F32 && dtype != DType::BF16) fail("--fusion-kernels --dtype ", dtype_text, ": f32 or bf16");
      print_fusion_kernels(models::preset(preset), batch * seq_len, steps, json, dtype);
      return;
    }
    const Precision parsed = precision_from_name(precision);
    const nn::RecomputeConfig rc = nn::recompute_config_from_names(recompute == "none" ? "" : recompute, "uniform", 1,
                                                                   recompute_modules);
    const nn::FusionConfig fc{.bias_activation = fusion == "on" || fusion == "bias-act",
                              .residual_norm = fusion == "on" || fusion == "residual-norm",
                              .layernorm_linear = fusion == "on" || fusion == "norm-linear",
                              .layernorm_mlp = fusion == "on" || fusion == "mlp-cast"};
    models::TransformerConfig config = models::preset(preset);
    if (layers > 0) config.num_layers = layers;
    BenchResult r = run_bench(config, batch, seq_len, steps, parsed, rc, fc);
    nlohmann::json peak_mb;
    for (size_t c = 0; c < kNumMemCategories; ++c)
      peak_mb[std::string(mem_category_name(static_cast<MemCategory>(c)))] = static_cast<double>(r.memory.peak[c]) / 1e6;
    peak_mb["total"] = static_cast<double>(r.memory.total_peak) / 1e6;
    nlohmann::json phases;
    for (size_t p = 0; p < kNumPhases; ++p) phases[kPhases[p]] = r.phase_s[p];
    if (json) {
      std::printf("%s\n", nlohmann::json{{"model", preset},
                                         {"layers", config.num_layers},
                                         {"precision", precision},
                                         {"recompute", recompute == "selective" ? "selective:" + recompute_modules : recompute},
                                         {"fusion", fusion},
                                         {"batch", batch},
                                         {"seq_len", seq_len},
                                         {"threads", num_threads()},
                                         {"cpu", {{"model", cpu.model}, {"features", cpu.features}}},
                                         {"step_s", r.step_s},
                                         {"tokens_per_s", r.tokens_per_s},
                                         {"achieved_gflops", r.gflops},
                                         {"sgemm_gflops", r.sgemm_gflops},
                                         {"sgemm_fraction", r.gflops / r.sgemm_gflops},
                                         {"gemm_ceiling_gflops", r.gemm_ceiling_gflops},
                                         {"ceiling_fraction", r.gflops / r.gemm_ceiling_gflops},
                                         {"gemm_library", kernels::cpu::gemm_library_name(
                                                              kernels::cpu::gemm_library(parsed.compute))},
                                         {"phase_s", phases},
                                         {"peak_memory_mb", peak_mb}}
                              .dump()
                              .c_str());
    } else {
      std::printf("%s %s (fusion %s) batch %ld x %ld, %d threads: median step %.3f s | %.0f tokens/s | %.1f GFLOP/s achieved | "
                  "sgemm ceiling %.1f GFLOP/s | %s GEMM ceiling %.1f GFLOP/s | %.1f%% of that ceiling\n",
                  preset.c_str(), precision.c_str(), fusion.c_str(), batch, seq_len, num_threads(), r.step_s, r.tokens_per_s, r.gflops,
                  r.sgemm_gflops, precision.c_str(), r.gemm_ceiling_gflops, 100.0 * r.gflops / r.gemm_ceiling_gflops);
      std::printf("median seconds per phase: %s\n", phases.dump().c_str());
      std::printf("peak memory (MB): %s\n", peak_mb.dump().c_str());
    }
  });
}

}  // namespace megaton::app
