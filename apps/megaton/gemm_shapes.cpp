#include "gemm_shapes.h"

#include "bench_timing.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "megaton/kernels/cpu/gemm.h"
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

}  // namespace megaton::app
