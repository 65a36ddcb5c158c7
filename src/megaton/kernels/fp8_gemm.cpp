#include "megaton/kernels/fp8_gemm.h"

#include <algorithm>
#include <array>
#include <vector>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/gemm.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/fp8_gemm.h"
#endif

namespace megaton::kernels {

namespace {

// Columns [k0, k0 + kw) of every row of m, widened into a row-major [rows, kw] panel of T; with
// fold_scales each value is multiplied by its (power-of-two, so exact) MX scale.
template <typename T>
void widen(const Fp8Matrix& m, int64_t k0, int64_t kw, bool fold_scales, T* panel) {
  std::array<float, 256> value;
  for (int c = 0; c < 256; ++c) value[static_cast<size_t>(c)] = fp8::decode(static_cast<uint8_t>(c), m.format());
  const int64_t rows = m.data.size(0), cols = m.data.size(1);
  const auto* codes = static_cast<const uint8_t*>(m.data.raw());
  const int64_t tile_cols = m.tile().cols;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float scale = 1.0f;  // the folded scale of the tile (k0 + k) lies in, looked up as a tile starts
    for (int64_t k = 0; k < kw; ++k) {
      if (fold_scales && (k == 0 || (k0 + k) % tile_cols == 0)) scale = m.scale_inv_at(r, k0 + k);
      panel[r * kw + k] = cpu::store<T>(value[codes[r * cols + k0 + k]] * scale);
    }
  }
}

// The K-group width: scales are constant over a group for both operands.
int64_t group_width(const Fp8Matrix& a, const Fp8Matrix& b, int64_t K) {
  return std::max<int64_t>(1, std::min({a.tile().cols, b.tile().cols, K}));
}

}  // namespace

void fp8_gemm(const ExecContext& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate,
              const Tensor& bias) {
  expect_on_device(ctx, "fp8_gemm", {&out, &a.data, &b.data, &a.scale_inv, &b.scale_inv});
  MEGATON_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1),
                "fp8_gemm: operands '", a.data.name(), "' ", shape_str(a.data.shape()), " and '", b.data.name(), "' ",
                shape_str(b.data.shape()), " must be [M, K] and [N, K]");
  const int64_t M = a.data.size(0), N = b.data.size(0), K = a.data.size(1);
  expect_matrix("fp8_gemm", out, M, N);
  MEGATON_CHECK(out.dtype() == DType::F32 || (out.dtype() == DType::BF16 && !accumulate),
                "fp8_gemm writes f32 (or bf16 without accumulate), output '", out.name(), "' is ", dtype_name(out.dtype()));
  const bool mx = a.granularity == Fp8Granularity::Mx1x32;
  MEGATON_CHECK(mx == (b.granularity == Fp8Granularity::Mx1x32), "fp8_gemm: MXFP8 operands pair with MXFP8 only, got ",
                granularity_name(a.granularity), " x ", granularity_name(b.granularity));
  if (bias.defined()) {
    expect_on_device(ctx, "fp8_gemm", {&bias});
    expect_matrix("fp8_gemm", bias, 1, N);
    MEGATON_CHECK(bias.dtype() == DType::F32 || bias.dtype() == DType::BF16, "fp8_gemm: bias '", bias.name(), "' is ",
                  dtype_name(bias.dtype()), ", expected f32 or bf16");
  }
  if (M == 0 || N == 0) return;
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::fp8_gemm(ctx, out, a, b, accumulate, bias);
#else
    fail("fp8_gemm on ", ctx.device.str(), ": this build has no CUDA backend");
#endif
  }

  const DType panel_dtype = cpu::gemm_library(DType::BF16) == cpu::GemmLibrary::OneDnn ? DType::BF16 : DType::F32;
  const int64_t group = mx ? K : group_width(a, b, K);
  const int64_t groups = K == 0 ? 1 : (K + group - 1) / group;
  // The fp32 sum over groups: `out` itself when it is f32, else a workspace rounded to bf16 at the end.
  Tensor acc = out.dtype() == DType::F32 ? out : Tensor::empty({M, N}, DType::F32, MemCategory::Workspace, "fp8_gemm_acc");
  float* C = acc.data<float>();
  if (!accumulate) acc.zero_();
  Tensor partial = Tensor::empty({M, N}, DType::F32, MemCategory::Workspace, "fp8_gemm_partial");
  Tensor pa = Tensor::empty({M, std::max<int64_t>(group, 1)}, panel_dtype, MemCategory::Workspace, "fp8_gemm_a_panel");
  Tensor pb = Tensor::empty({N, std::max<int64_t>(group, 1)}, panel_dtype, MemCategory::Workspace, "fp8_gemm_b_panel");
  std::vector<float> sa(static_cast<size_t>(M)), sb(static_cast<size_t>(N));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * group, kw = std::min(group, K - k0);
    if (panel_dtype == DType::BF16) {
      widen(a, k0, kw, mx, pa.data<BFloat16>());
      widen(b, k0, kw, mx, pb.data<BFloat16>());
    } else {
      widen(a, k0, kw, mx, pa.data<float>());
      widen(b, k0, kw, mx, pb.data<float>());
    }
    cpu::gemm({.M = M, .N = N, .K = kw, .in = panel_dtype, .a = {pa.raw(), false}, .b = {pb.raw(), true},
               .c = partial.raw(), .c_dtype = DType::F32});
    for (int64_t m = 0; m < M; ++m) sa[static_cast<size_t>(m)] = mx ? 1.0f : a.scale_inv_at(m, k0);
    for (int64_t n = 0; n < N; ++n) sb[static_cast<size_t>(n)] = mx ? 1.0f : b.scale_inv_at(n, k0);
    const float* P = partial.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * N + n] += P[m * N + n] * sa[static_cast<size_t>(m)] * sb[static_cast<size_t>(n)];
  }
  if (bias.defined()) {
    std::vector<float> row(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n)
      row[static_cast<size_t>(n)] = bias.dtype() == DType::F32 ? bias.data<float>()[n] : cpu::load(bias.data<BFloat16>()[n]);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * N + n] += row[static_cast<size_t>(n)];
  }
  if (out.dtype() == DType::BF16) {
    auto* dst = out.data<BFloat16>();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < M * N; ++i) dst[i] = cpu::store<BFloat16>(C[i]);
  }
}

}  // namespace megaton::kernels
