#include "megaton/kernels/quantized_linear.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/cpu/gemv_quantized.h"
#include "megaton/kernels/decode_rows.h"
#include "megaton/kernels/fp8_quantize.h"
#include "megaton/kernels/linear_shape.h"

namespace megaton::kernels {
namespace {

// Output rows dequantised per GEMM in the prefill path. A few rows (continuous batching past
// kDecodeRows) take narrow bands, whose dequantised block and GEMM output stay in L1 / L2; many rows
// (a prompt) take wide ones, so x is packed for fewer GEMMs. Measured on one thread, 8192 x 2048
// int8: 16 rows 12.3 ms with 256-row bands, 6.8 ms with 16; 256 rows 71.5 ms with 256-row bands,
// 126.7 ms with 16.
int64_t prefill_band(int64_t rows) { return rows <= 16 ? 16 : 256; }

// Calls f(T{}) for the activation type: f32 or bf16 (checked by the caller).
template <typename F>
void with_activation_type(DType dtype, F&& f) {
  if (dtype == DType::BF16) return f(BFloat16{});
  f(float{});
}

cpu::QuantizedRows rows_of(const QuantizedWeight& w) {
  return {w.codes.raw(), w.codes.dtype(), w.scale_inv.data<float>(), w.block_rows, w.block_cols};
}

void expect_finite(const Tensor& w32, const std::string& name) {
  const float* p = w32.data<float>();
  for (int64_t i = 0; i < w32.numel(); ++i)
    if (!std::isfinite(p[i])) fail("quantize_weight: '", name, "' holds a non-finite value at element ", i);
}

QuantizedWeight quantize_int8_rows(const Tensor& w32, const std::string& name) {
  const int64_t out = w32.size(0), in = w32.size(1);
  QuantizedWeight q{WeightQuant::Int8Row, Tensor::empty({out, in}, DType::I8, MemCategory::Params, name + ".int8"),
                    Tensor::empty({out, 1}, DType::F32, MemCategory::Params, name + ".scale_inv"), 1, in};
  const float* src = w32.data<float>();
  int8_t* codes = q.codes.data<int8_t>();
  float* scale_inv = q.scale_inv.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < out; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < in; ++c) amax = std::max(amax, std::abs(src[r * in + c]));
    scale_inv[r] = amax / 127.0f;
    const float scale = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t c = 0; c < in; ++c)  // |w| * 127 / amax <= 127: no clamp needed beyond rounding
      codes[r * in + c] = static_cast<int8_t>(std::clamp(std::nearbyint(src[r * in + c] * scale), -127.0f, 127.0f));
  }
  return q;
}

QuantizedWeight quantize_f32(const Tensor& w32, WeightQuant q, const std::string& name) {
  expect_finite(w32, name);
  if (q == WeightQuant::Int8Row) return quantize_int8_rows(w32, name);
  Fp8QuantizeOptions o;
  o.granularity = Fp8Granularity::Block128x128;
  o.category = MemCategory::Params;
  Fp8Matrix m = fp8_quantize(w32, o, name + ".fp8");
  return {WeightQuant::Fp8Block, std::move(m.data), std::move(m.scale_inv), 128, 128};
}

}  // namespace

std::string_view weight_quant_name(WeightQuant q) { return q == WeightQuant::Int8Row ? "int8" : "fp8-block"; }

WeightQuant weight_quant_from_name(std::string_view s) {
  if (s == "int8") return WeightQuant::Int8Row;
  if (s == "fp8-block") return WeightQuant::Fp8Block;
  fail("unknown quantised weight dtype '", s, "' (expected int8 or fp8-block)");
}

QuantizedWeight quantize_weight(const Tensor& w, WeightQuant q) {
  if (w.dim() != 2) fail("quantize_weight: '", w.name(), "' has shape ", shape_str(w.shape()), ", expected 2-D");
  if (!w.device().is_cpu()) fail("quantize_weight: '", w.name(), "' is not on the cpu");
  if (w.dtype() == DType::F32) return quantize_f32(w, q, w.name());
  // Widened kSlab rows at a time (whole 128 x 128 blocks), never whole: a served model's tied head in
  // bf16 would otherwise take a transient f32 copy of the embedding (1 GB for llama3-1b's).
  constexpr int64_t kSlab = 128;
  const int64_t rows = w.size(0);
  QuantizedWeight out;
  for (int64_t r0 = 0; r0 < rows; r0 += kSlab) {
    const int64_t r1 = std::min(rows, r0 + kSlab);
    const QuantizedWeight part = quantize_f32(w.slice_rows(r0, r1).to(DType::F32, MemCategory::Workspace), q, w.name());
    if (r0 == 0) {
      const int64_t scale_rows = (rows + part.block_rows - 1) / part.block_rows;
      out = {
          q, Tensor::empty(w.shape(), part.codes.dtype(), MemCategory::Params, part.codes.name()),
          Tensor::empty({scale_rows, part.scale_inv.size(1)}, DType::F32, MemCategory::Params, part.scale_inv.name()),
          part.block_rows, part.block_cols};
    }
    out.codes.slice_rows(r0, r1).copy_from(part.codes);
    const int64_t s0 = r0 / part.block_rows;
    out.scale_inv.slice_rows(s0, s0 + part.scale_inv.size(0)).copy_from(part.scale_inv);
  }
  return out;
}

Tensor dequantize_weight(const QuantizedWeight& w) {
  const int64_t out = w.codes.size(0), in = w.codes.size(1);
  Tensor t = Tensor::empty({out, in}, DType::F32, MemCategory::Workspace, w.codes.name() + ".dequantized");
  cpu::dequantize_rows(t.data<float>(), rows_of(w), in, 0, out);
  return t;
}

QuantizedWeight with_row_bands(QuantizedWeight w, int64_t max_band) {
  if (w.block_rows != 1) return w;
  const int64_t out = w.scale_inv.size(0), cols = w.scale_inv.size(1);
  // Compared as bits: -0 / +0 and NaN payloads differ.
  const auto* s = static_cast<const uint32_t*>(w.scale_inv.raw());
  const auto uniform = [&](int64_t b) {
    for (int64_t r = 0; r < out; ++r)
      if (!std::equal(s + r * cols, s + (r + 1) * cols, s + (r - r % b) * cols)) return false;
    return true;
  };
  int64_t band = max_band;
  while (band > 1 && !uniform(band)) band /= 2;
  if (band <= 1) return w;
  const int64_t bands = (out + band - 1) / band;
  Tensor banded = Tensor::empty({bands, cols}, DType::F32, w.scale_inv.category(), w.scale_inv.name());
  for (int64_t b = 0; b < bands; ++b)
    std::copy(s + b * band * cols, s + (b * band + 1) * cols, static_cast<uint32_t*>(banded.raw()) + b * cols);
  w.scale_inv = std::move(banded);
  w.block_rows = band;
  return w;
}

void quantized_linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const QuantizedWeight& w,
                              const Tensor& bias) {
  constexpr std::string_view op = "quantized_linear_forward";
  expect_on_device(ctx, op, {&out, &x, &w.codes});
  if (!ctx.device.is_cpu()) fail("kernel ", op, " runs on the cpu only");
  const LinearShape s = check_linear(op, w.codes, x, out, &bias);
  expect_dtype(x.dtype(), op, {&out});
  if (x.dtype() != DType::F32 && x.dtype() != DType::BF16)
    fail("kernel ", op, ": input '", x.name(), "' holds ", dtype_name(x.dtype()), ", expected f32 or bf16");
  const cpu::QuantizedRows rows = rows_of(w);
  if (s.rows <= kDecodeRows) {
    return with_activation_type(x.dtype(), [&]<typename T>(T) {
      const auto run = [&]<typename B>(B) {
        cpu::gemv_quantized(out.data<T>(), x.data<T>(), rows, data_or_null<B>(bias), s.rows, s.in, s.out);
      };
      if (bias.defined()) return dispatch_cpu_param<T>(op, bias, run);
      run(float{});
    });
  }
  // Prefill: f32 GEMMs over bands of dequantised output rows, scattered into out. The bands are split
  // over the threads, each dequantising its band and multiplying it alone (a GEMM inside a parallel
  // region runs on its caller), so there is no fork / join per band.
  const Tensor xf = x.dtype() == DType::F32 ? x : x.to(DType::F32, MemCategory::Workspace);
  const Tensor bf = !bias.defined() || bias.dtype() == DType::F32 ? bias : bias.to(DType::F32, MemCategory::Workspace);
  const int64_t band = std::min(prefill_band(s.rows), s.out), bands = (s.out + band - 1) / band;
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), bands));
  Tensor wbands = Tensor::empty({threads, band, s.in}, DType::F32, MemCategory::Workspace, "quantized_linear.band");
  Tensor ybands =
      Tensor::empty({threads, s.rows, band}, DType::F32, MemCategory::Workspace, "quantized_linear.out_band");
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    float* wb = wbands.data<float>() + t * band * s.in;
    float* yb = ybands.data<float>() + t * s.rows * band;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t r0 = b * band, n = std::min(band, s.out - r0);
      cpu::dequantize_rows(wb, rows, s.in, r0, r0 + n);
      cpu::gemm({s.rows,
                 n,
                 s.in,
                 DType::F32,
                 {xf.data<float>(), false},
                 {wb, true},
                 yb,
                 DType::F32,
                 false,
                 bf.defined() ? bf.data<float>() + r0 : nullptr,
                 DType::F32});
      with_activation_type(x.dtype(), [&]<typename T>(T) {
        T* y = out.data<T>();
        for (int64_t i = 0; i < s.rows; ++i)
          for (int64_t j = 0; j < n; ++j) y[i * s.out + r0 + j] = cpu::store<T>(yb[i * n + j]);
      });
    }
  }
}

}  // namespace megaton::kernels
