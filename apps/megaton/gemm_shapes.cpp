#include "gemm_shapes.h"

#include "bench_timing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/fp8_gemm.h"
#include "megaton/kernels/fp8_gemm_cublas.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/sgemm_ceiling.h"

namespace megaton::app {

namespace {

struct LinearShape {
  std::string name;
  int64_t rows, in_f, out_f;  // rows: tokens the GEMM sees at once
};

// The linears of one layer plus the output head, as nn/ builds them. The head runs in chunks of
// 256 rows (nn/output_head.cpp), so that is the shape its GEMMs see.
std::vector<LinearShape> linear_shapes(const models::TransformerConfig& c, int64_t tokens) {
  const bool swiglu = c.activation == models::Activation::SwiGLU;
  const int64_t q_size = c.num_attention_heads * c.head_dim();
  return {{"linear_qkv", tokens, c.hidden_size, c.qkv_size()},
          {"linear_proj", tokens, q_size, c.hidden_size},
          {"linear_fc1", tokens, c.hidden_size, (swiglu ? 2 : 1) * c.ffn_hidden_size},
          {"linear_fc2", tokens, c.ffn_hidden_size, c.hidden_size},
          {"output_layer", std::min<int64_t>(tokens, 256), c.hidden_size, c.vocab_size}};
}

}  // namespace

// The ceiling the per-shape rates (and `megaton bench`'s achieved rate) are compared with. A bf16
// GEMM on the cpu runs at the rate of whatever library serves it (kernels/cpu/gemm.h).
double gemm_ceiling_gflops(Device device, DType dtype) {
  if (device.is_cpu() && dtype == DType::F32) return kernels::measure_sgemm_gflops();
  const int64_t n = device.is_cpu() ? 1536 : 8192;
  const Tensor a = random_tensor({n, n}, dtype, device, 1, "a"), b = random_tensor({n, n}, dtype, device, 2, "b");
  const Tensor c = random_tensor({n, n}, dtype, device, 3, "c");
  const kernels::ExecContext ctx{device, nullptr};
  double best = 0;
  for (int r = 0; r < 10; ++r) {
    const double s = median_seconds(device, 1, device.is_cpu() ? 1 : 3,
                                    [&] { kernels::linear_forward(ctx, c, a, b, Tensor()); });
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

void print_gemm_shapes(const models::TransformerConfig& cfg, int64_t tokens, int repeats, bool json, Device device,
                       DType dtype) {
  const double ceiling = gemm_ceiling_gflops(device, dtype);
  // Which library ran the CPU GEMMs (the rule in kernels/cpu/gemm.h, or --cpu-gemm).
  const std::string library = device.is_cpu() ? kernels::cpu::gemm_library_name(kernels::cpu::gemm_library(dtype)) : "cublaslt";
  if (!json) std::printf("%s GEMMs on %s\n", std::string(dtype_name(dtype)).c_str(), library.c_str());
  const int calls = device.is_cpu() ? 1 : 20;  // device GEMMs take microseconds: time batches of them
  const kernels::ExecContext ctx{device, nullptr};
  for (const LinearShape& s : linear_shapes(cfg, tokens)) {
    const Tensor x = random_tensor({s.rows, s.in_f}, dtype, device, 1, "x");
    const Tensor w = random_tensor({s.out_f, s.in_f}, dtype, device, 2, "w");
    const Tensor y = random_tensor({s.rows, s.out_f}, dtype, device, 3, "y");
    const Tensor dx = random_tensor({s.rows, s.in_f}, dtype, device, 4, "dx");
    // The CPU accumulates a bf16 linear's weight gradient into an fp32 main grad only.
    const Tensor dw = random_tensor({s.out_f, s.in_f}, device.is_cpu() ? DType::F32 : dtype, device, 5, "dw");
    const auto time = [&](auto&& f) { return median_seconds(device, repeats, calls, f); };
    const struct {
      const char* pass;
      double seconds;
    } passes[] = {
        {"forward", time([&] { kernels::linear_forward(ctx, y, x, w, Tensor()); })},
        {"dgrad", time([&] { kernels::linear_backward_input(ctx, dx, y, w); })},
        {"wgrad", time([&] { kernels::linear_backward_weight(ctx, dw, Tensor(), y, x); })},
    };
    for (const auto& p : passes) {
      const double gflops = 2.0 * static_cast<double>(s.rows) * s.in_f * s.out_f / p.seconds / 1e9;
      if (json)
        std::printf("%s\n", nlohmann::json{{"linear", s.name}, {"pass", p.pass}, {"rows", s.rows}, {"in", s.in_f},
                                           {"out", s.out_f}, {"device", device.str()}, {"dtype", dtype_name(dtype)}, {"library", library},
                                           {"gflops", gflops}, {"ceiling_gflops", ceiling},
                                           {"fraction", gflops / ceiling}}
                                .dump()
                                .c_str());
      else
        std::printf("%-13s %-8s rows %5ld in %6ld out %6ld: %9.1f GFLOP/s (%3.0f%% of the %.1f GFLOP/s ceiling)\n",
                    s.name.c_str(), p.pass, s.rows, s.in_f, s.out_f, gflops, 100.0 * gflops / ceiling, ceiling);
    }
  }
}

void print_fp8_gemm_shapes(const models::TransformerConfig& cfg, int64_t tokens, int repeats, bool json, Device device,
                           bool blockwise) {
  using G = kernels::Fp8Granularity;
  const G act = blockwise ? G::Tile1x128 : G::Tensor, weight = blockwise ? G::Block128x128 : G::Tensor;
  // Gradients in E5M2 under per-tensor scaling (HYBRID), E4M3 everywhere under DeepSeek-V3's blocks.
  const fp8::Format grad = blockwise ? fp8::Format::E4M3 : fp8::Format::E5M2;
  const char* recipe = blockwise ? "fp8-blockwise" : "fp8-tensorwise";
  if (!json) std::printf("%s GEMMs on %s, against bf16 on the same shapes\n", recipe, device.str().c_str());
  const int calls = device.is_cpu() ? 1 : 20;
  const kernels::ExecContext ctx{device, nullptr};
  const auto quantize = [](const Tensor& t, G g, fp8::Format f, bool transpose) {
    return kernels::fp8_quantize(t, {.format = f, .granularity = g, .transpose = transpose}, t.name() + "_fp8");
  };
  for (const LinearShape& s : linear_shapes(cfg, tokens)) {
    const Tensor x = random_tensor({s.rows, s.in_f}, DType::BF16, device, 1, "x");
    const Tensor w = random_tensor({s.out_f, s.in_f}, DType::BF16, device, 2, "w");
    const Tensor dy = random_tensor({s.rows, s.out_f}, DType::BF16, device, 3, "dy");
    const Tensor y = random_tensor({s.rows, s.out_f}, DType::BF16, device, 4, "y");
    const Tensor dx = random_tensor({s.rows, s.in_f}, DType::BF16, device, 5, "dx");
    const Tensor dw = random_tensor({s.out_f, s.in_f}, DType::F32, device, 6, "dw");
    const Tensor dw_bf16 = random_tensor({s.out_f, s.in_f}, device.is_cpu() ? DType::F32 : DType::BF16, device, 7, "dw");
    const auto time = [&](auto&& f) { return median_seconds(device, repeats, calls, f); };
    // Each pass's operands (K-contiguous, as the FP8 GEMM takes them), its output and its bf16 twin.
    struct Pass {
      const char* name;
      std::function<std::pair<kernels::Fp8Matrix, kernels::Fp8Matrix>()> operands;
      Tensor out;
      bool accumulate;
      std::function<void()> bf16;
    } passes[] = {
        {"forward", [&] { return std::pair{quantize(x, act, fp8::Format::E4M3, false), quantize(w, weight, fp8::Format::E4M3, false)}; },
         y, false, [&] { kernels::linear_forward(ctx, y, x, w, Tensor()); }},
        {"dgrad", [&] { return std::pair{quantize(dy, act, grad, false), quantize(w, weight, fp8::Format::E4M3, true)}; },
         dx, false, [&] { kernels::linear_backward_input(ctx, dx, dy, w); }},
        {"wgrad", [&] { return std::pair{quantize(dy, act, grad, true), quantize(x, act, fp8::Format::E4M3, true)}; },
         dw, true, [&] { kernels::linear_backward_weight(ctx, dw_bf16, Tensor(), dy, x); }},
    };
    for (const Pass& p : passes) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto operands = p.operands();  // not a structured binding: clang 14 cannot capture one
      const kernels::Fp8Matrix& a = operands.first;
      const kernels::Fp8Matrix& b = operands.second;
      const double quantize_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::json row{{"linear", s.name}, {"pass", p.name}, {"rows", s.rows}, {"in", s.in_f}, {"out", s.out_f},
                         {"device", device.str()}, {"recipe", recipe}};
      const std::string why = device.is_cuda() ? kernels::cublas_fp8_unsupported(a, b, p.out.dtype(), Tensor()) : "";
      if (!why.empty()) {
        row["skipped"] = why;
        if (json) std::printf("%s\n", row.dump().c_str());
        else std::printf("%-13s %-8s skipped: %s\n", s.name.c_str(), p.name, why.c_str());
        continue;
      }
      const double flop = 2.0 * static_cast<double>(s.rows) * s.in_f * s.out_f;
      const double fp8_gflops = flop / time([&] { kernels::fp8_gemm(ctx, p.out, a, b, p.accumulate); }) / 1e9;
      const double bf16_gflops = flop / time(p.bf16) / 1e9;
      row.update({{"fp8_gflops", fp8_gflops}, {"bf16_gflops", bf16_gflops}, {"speedup", fp8_gflops / bf16_gflops},
                  {"quantize_ms", 1e3 * quantize_s}});
      if (json)
        std::printf("%s\n", row.dump().c_str());
      else
        std::printf("%-13s %-8s rows %5ld in %6ld out %6ld: fp8 %9.1f GFLOP/s, bf16 %9.1f: %.2fx (operands quantised in %.2f ms)\n",
                    s.name.c_str(), p.name, s.rows, s.in_f, s.out_f, fp8_gflops, bf16_gflops, fp8_gflops / bf16_gflops,
                    1e3 * quantize_s);
    }
  }
}

}  // namespace megaton::app
