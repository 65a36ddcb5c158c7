#include "gemm_shapes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

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

// Median seconds of `repeats` calls after one warm-up call.
template <typename F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> t;
  for (int r = 0; r <= repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    if (r > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<int64_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

void print_gemm_shapes(const models::TransformerConfig& cfg, int64_t tokens, int repeats, bool json) {
  const double ceiling = kernels::measure_sgemm_gflops();
  for (const LinearShape& s : linear_shapes(cfg, tokens)) {
    const auto filled = [](Shape shape, float v, const char* name) {
      Tensor t = Tensor::empty(std::move(shape), DType::F32, MemCategory::Workspace, name);
      std::fill_n(t.data<float>(), t.numel(), v);
      return t;
    };
    const Tensor x = filled({s.rows, s.in_f}, 0.5f, "x"), w = filled({s.out_f, s.in_f}, 0.25f, "w");
    const Tensor y = filled({s.rows, s.out_f}, 0.125f, "y"), dx = filled({s.rows, s.in_f}, 0, "dx");
    const Tensor dw = filled({s.out_f, s.in_f}, 0, "dw");
    const kernels::ExecContext cpu;
    const struct {
      const char* pass;
      double seconds;
    } passes[] = {
        {"forward", median_seconds(repeats, [&] { kernels::linear_forward(cpu, y, x, w, Tensor()); })},
        {"dgrad", median_seconds(repeats, [&] { kernels::linear_backward_input(cpu, dx, y, w); })},
        {"wgrad", median_seconds(repeats, [&] { kernels::linear_backward_weight(cpu, dw, Tensor(), y, x); })},
    };
    for (const auto& p : passes) {
      const double gflops = 2.0 * static_cast<double>(s.rows) * s.in_f * s.out_f / p.seconds / 1e9;
      if (json)
        std::printf("%s\n", nlohmann::json{{"linear", s.name}, {"pass", p.pass}, {"rows", s.rows}, {"in", s.in_f},
                                           {"out", s.out_f}, {"gflops", gflops}, {"sgemm_gflops", ceiling},
                                           {"fraction", gflops / ceiling}}
                                .dump()
                                .c_str());
      else
        std::printf("%-13s %-8s rows %5ld in %6ld out %6ld: %7.1f GFLOP/s (%3.0f%% of the %.1f GFLOP/s ceiling)\n",
                    s.name.c_str(), p.pass, s.rows, s.in_f, s.out_f, gflops, 100.0 * gflops / ceiling, ceiling);
    }
  }
}

}  // namespace megaton::app
