#include "megaton/kernels/fp8_gemm_cublas.h"

namespace megaton::kernels {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

std::string pair_name(const Fp8Matrix& a, const Fp8Matrix& b) {
  return std::string(granularity_name(a.granularity)) + " x " + std::string(granularity_name(b.granularity));
}

}  // namespace

std::string cublas_fp8_unsupported(const Fp8Matrix& a, const Fp8Matrix& b, DType out, const Tensor& bias) {
  using G = Fp8Granularity;
  const G ga = a.granularity, gb = b.granularity;
  const int64_t M = a.data.size(0), N = b.data.size(0), K = a.data.size(1);
  if (ga == G::Mx1x32 || gb == G::Mx1x32) return "MXFP8 GEMMs need Blackwell (sm_100); Hopper has none";
  const bool tensor = ga == G::Tensor && gb == G::Tensor;
  if (!tensor && (ga == G::Tensor || gb == G::Tensor))
    return "per-tensor and block scales do not mix in one cuBLASLt GEMM (" + pair_name(a, b) + ")";
  if (ga == G::Block128x128 && gb == G::Block128x128)
    return "cuBLASLt has no 128x128 x 128x128 mode: quantise one operand in 1x128 tiles";
  if (a.format() == fp8::Format::E5M2 && b.format() == fp8::Format::E5M2)
    return "cuBLASLt multiplies E5M2 only with E4M3, not E5M2 x E5M2";
  if (!tensor && (a.format() != fp8::Format::E4M3 || b.format() != fp8::Format::E4M3))
    return "block-scaled GEMMs take E4M3 operands (DeepSeek-V3's recipe), got " +
           std::string(fp8::info(a.format()).name) + " x " + std::string(fp8::info(b.format()).name);
  if (K % 16 != 0) return "K = " + std::to_string(K) + " must be a multiple of 16 (FP8 rows are 16-byte aligned)";
  if (!tensor && N % 8 != 0) return "N = " + std::to_string(N) + " must be a multiple of 8 with block scales";
  if (!tensor && ga == G::Tile1x128 && M % 8 != 0)
    return "M = " + std::to_string(M) + " must be a multiple of 8 with 1x128 tiles on a";
  if (out != DType::F32 && out != DType::BF16) return "the output must be f32 or bf16, not " + std::string(dtype_name(out));
  if (bias.defined()) {
    if (!tensor) return "a bias goes with per-tensor scaling only (" + pair_name(a, b) + ")";
    if (bias.dtype() != DType::BF16)
      return "the bias '" + bias.name() + "' must be bf16 (cuBLASLt's FP8 epilogue), not " +
             std::string(dtype_name(bias.dtype()));
  }
  return {};
}

CublasScaleLayout cublas_scale_layout(const Fp8Matrix& m) {
  const int64_t rows = m.scale_inv.size(0), groups = m.scale_inv.size(1);
  switch (m.granularity) {
    case Fp8Granularity::Tile1x128: return {groups, round_up(rows, 4), true};
    case Fp8Granularity::Block128x128: return {rows, round_up(groups, 4), false};
    default: return {};
  }
}

}  // namespace megaton::kernels
