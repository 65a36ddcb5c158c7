#include "megaton/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "megaton/kernels/cpu/rope.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/rope.h"
#endif

namespace megaton::kernels {

namespace {

// Llama-3 scaling of one inverse frequency, as HF transformers' _compute_llama3_parameters:
// short wavelengths are kept, long ones slowed down by `factor`, and the band in between
// interpolates smoothly between the two.
double llama3_scaled(double inv_freq, const RopeScaling& s) {
  const double wavelen = 2.0 * std::numbers::pi / inv_freq;
  if (wavelen < s.original_max_position / s.high_freq_factor) return inv_freq;
  if (wavelen > s.original_max_position / s.low_freq_factor) return inv_freq / s.factor;
  const double smooth =
      (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

// cos and sin: tables [P, half] of the same shape; returns P.
int64_t check_tables(std::string_view op, const Tensor& cos, const Tensor& sin, int64_t half) {
  if (half <= 0 || cos.dim() == 0 || cos.size(-1) != half)
    fail("kernel ", op, ": table '", cos.name(), "' has shape ", shape_str(cos.shape()), ", expected [positions, ",
         half, "]");
  const int64_t P = cos.numel() / half;
  expect_matrix(op, cos, P, half);
  expect_matrix(op, sin, P, half);
  return P;
}

// YaRN, as DeepSeek's yarn_find_correction_range / yarn_linear_ramp_mask: the (fractional) pair
// index whose wavelength turns `rotations` times over the original context, and the weight of the
// unscaled frequency of pair i, 1 below the fast bound falling linearly to 0 at the slow one.
double yarn_correction_dim(double rotations, double D, double theta, double original_max_position) {
  return D * std::log(original_max_position / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

double yarn_kept_weight(int64_t i, int64_t D, double theta, const RopeScaling& s) {
  const double d = static_cast<double>(D);
  const double low = std::max(std::floor(yarn_correction_dim(s.beta_fast, d, theta, s.original_max_position)), 0.0);
  double high = std::min(std::ceil(yarn_correction_dim(s.beta_slow, d, theta, s.original_max_position)), d - 1.0);
  if (high == low) high += 0.001;  // as DeepSeek: no division by zero
  const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
  return 1.0 - ramp;
}

}  // namespace

std::vector<double> rope_inv_freq(int64_t D, double theta, const RopeScaling& scaling) {
  MEGATON_CHECK(D > 0 && D % 2 == 0, "rope head_dim ", D, " must be positive and even");
  std::vector<double> inv_freq(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D));
    double scaled = f;
    if (scaling.factor > 0.0 && scaling.yarn) {
      const double kept = yarn_kept_weight(i, D, theta, scaling);
      scaled = f / scaling.factor * (1.0 - kept) + f * kept;
    } else if (scaling.factor > 0.0) {
      scaled = llama3_scaled(f, scaling);
    }
    inv_freq[static_cast<size_t>(i)] = scaled;
  }
  return inv_freq;
}

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

double rope_magnitude(const RopeScaling& s) {
  if (!(s.factor > 0.0 && s.yarn)) return 1.0;
  return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
}

double rope_softmax_factor(const RopeScaling& s) {
  if (!(s.factor > 0.0 && s.yarn) || s.mscale_all_dim == 0.0) return 1.0;
  const double m = yarn_mscale(s.factor, s.mscale_all_dim);
  return m * m;
}

void rope_tables(const ExecContext& ctx, const Tensor& cos, const Tensor& sin, const std::vector<double>& inv_freq,
                 double magnitude) {
  constexpr std::string_view op = "rope_tables";
  expect_on_device(ctx, op, {&cos, &sin});
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  const int64_t P = check_tables(op, cos, sin, half);
  expect_dtype(cos.dtype(), op, {&sin});
  if (ctx.device.is_cuda()) {  // the same double-precision tables, made on the host and copied over
    Tensor c = Tensor::empty(cos.shape(), cos.dtype(), MemCategory::Workspace, cos.name());
    Tensor s = Tensor::empty(sin.shape(), sin.dtype(), MemCategory::Workspace, sin.name());
    rope_tables(ExecContext::on(c), c, s, inv_freq, magnitude);
    Tensor(cos).copy_from(c);  // a copy shares the storage
    Tensor(sin).copy_from(s);
    return;
  }
  dispatch_cpu_float(cos.dtype(), op,
                     [&]<typename T>(T) { cpu::rope_tables(cos.data<T>(), sin.data<T>(), P, 2 * half, inv_freq, magnitude); });
}

void rope_apply(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t B, int64_t Tlen,
                int64_t groups, int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, RopeLayout layout,
                bool inverse) {
  constexpr std::string_view op = "rope_apply";
  expect_on_device(ctx, op, {&x, &cos, &sin});
  if (D <= 0 || D % 2 != 0) fail("kernel ", op, ": head_dim ", D, " must be positive and even");
  if (B < 0 || Tlen < 0 || groups < 0 || H < 0 || pos_offset < 0)
    fail("kernel ", op, ": negative size (B ", B, ", Tlen ", Tlen, ", groups ", groups, ", H ", H, ", pos_offset ",
         pos_offset, ")");
  const int64_t P = check_tables(op, cos, sin, D / 2);
  if (checked_add(op, pos_offset, Tlen) > P)
    fail("kernel ", op, ": positions up to ", pos_offset + Tlen, " need that many rows of table '", cos.name(),
         "', it has ", P);
  expect_holds(op, x, 0, {{checked_mul(op, B, Tlen), at.row}, {groups, at.group}, {H, D}}, D);
  const bool cpu_bf16 = ctx.device.is_cpu() && x.dtype() == DType::BF16;  // rotated in fp32: f32 tables
  expect_dtype(cpu_bf16 ? DType::F32 : x.dtype(), op, {&cos, &sin});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::rope_apply(ctx, x, cos, sin, B, Tlen, groups, H, D, at, pos_offset, layout, inverse);
#endif
    fail_no_backend(ctx, op);
  }
  if (cpu_bf16)
    return cpu::rope_apply(x.data<BFloat16>(), cos.data<float>(), sin.data<float>(), B, Tlen, groups, H, D, at,
                           pos_offset, layout, inverse);
  dispatch_cpu_float(x.dtype(), op, [&]<typename T>(T) {
    cpu::rope_apply(x.data<T>(), cos.data<T>(), sin.data<T>(), B, Tlen, groups, H, D, at, pos_offset, layout, inverse);
  });
}

}  // namespace megaton::kernels
