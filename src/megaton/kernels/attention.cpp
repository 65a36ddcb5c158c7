#include "megaton/kernels/attention.h"

#include <algorithm>
#include <atomic>

#include "megaton/kernels/cpu/attention.h"
#include "megaton/kernels/cpu/attention_bf16.h"
#include "megaton/kernels/cpu/decode_attention.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/flash_attention_plan.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/attention.h"
#include "megaton/kernels/cuda/flash_attention.h"
#endif

namespace megaton::kernels {

namespace {

struct AttentionDims {
  int64_t B, Tlen, Hq, Hkv;
  HeadDim D;
};

void check_dims(std::string_view op, const AttentionDims& d, int64_t pos_offset) {
  if (d.B < 0 || d.Tlen < 0 || d.D.qk <= 0 || d.D.v <= 0 || d.Hkv <= 0 || d.Hq <= 0 || d.Hq % d.Hkv != 0 ||
      pos_offset < 0)
    fail("kernel ", op, ": invalid sizes B ", d.B, ", Tlen ", d.Tlen, ", Hq ", d.Hq, ", Hkv ", d.Hkv, ", D ", d.D.qk,
         " (qk) / ", d.D.v, " (v), pos_offset ", pos_offset, " (Hq must be a positive multiple of Hkv, D positive)");
}

// out / dout [B*Tlen, Hq*D.v] and lse [B, Hq, Tlen], with overflow-checked element counts.
void check_outputs(std::string_view op, const AttentionDims& d, std::initializer_list<const Tensor*> like_out,
                   const Tensor& lse) {
  const int64_t rows = checked_mul(op, d.B, d.Tlen), cols = checked_mul(op, d.Hq, d.D.v);
  checked_mul(op, rows, cols);
  for (const Tensor* t : like_out) expect_matrix(op, *t, rows, cols);
  expect_matrix(op, lse, checked_mul(op, d.B, d.Hq), d.Tlen);
}

// Query heads: Tlen tokens per batch row, each with Hkv groups of Hq/Hkv heads.
void expect_q_heads(std::string_view op, TensorAt q, const AttentionDims& d, HeadStrides at) {
  expect_holds(op, q.t, q.offset,
               {{checked_mul(op, d.B, d.Tlen), at.row}, {d.Hkv, at.group}, {d.Hq / d.Hkv, d.D.qk}}, d.D.qk);
}

// kv heads of `width` elements: Tk tokens per batch row (batch rows batch_stride apart), one head per group.
void expect_kv_heads(std::string_view op, TensorAt kv, const AttentionDims& d, int64_t Tk, int64_t batch_stride,
                     HeadStrides at, int64_t width) {
  expect_holds(op, kv.t, kv.offset, {{d.B, batch_stride}, {Tk, at.row}, {d.Hkv, at.group}}, width);
}

bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

// lse is kept in f32 for bf16 / f16 attention, in the inputs' dtype otherwise.
DType lse_dtype(DType t) { return is_half(t) ? DType::F32 : t; }

#ifdef MEGATON_WITH_CUDA
// Element address of a tensor's element `offset` (2-byte elements), so that one multiple-of-8 check
// covers the base address's 16-byte alignment and the offset.
int64_t element_address(const TensorAt& x) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.t.raw()) / 2) + x.offset;
}

// bf16 / f16 attention on CUDA runs the flash kernels; fails naming the op where they cannot.
void expect_flash(std::string_view op, DType dtype, const AttentionDims& d, std::initializer_list<int64_t> offsets) {
  const std::string why = flash_attention_unsupported(dtype, d.D, d.B, d.Hq, d.Hkv, offsets);
  if (!why.empty()) fail("kernel ", op, " on cuda: ", why);
}
#endif

std::atomic<bool> f32_forced{false};

}  // namespace

DType attention_dtype(const ExecContext& ctx, DType activations) {
  if (activations != DType::BF16 || f32_forced || !ctx.device.is_cpu()) return DType::F32;
  return cpu::gemm_library(DType::BF16) == cpu::GemmLibrary::OneDnn ? DType::BF16 : DType::F32;
}

void force_f32_attention(bool on) { f32_forced = on; }

void attention_forward(const ExecContext& ctx, const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v,
                       int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                       double scale, int64_t pos_offset, int64_t kv_batch_stride) {
  constexpr std::string_view op = "attention_forward";
  expect_on_device(ctx, op, {&out, &lse, &q.t, &k.t, &v.t});
  const AttentionDims d{B, Tlen, Hq, Hkv, D};
  check_dims(op, d, pos_offset);
  check_outputs(op, d, {&out}, lse);
  const int64_t Tk = checked_add(op, pos_offset, Tlen);
  if (kv_batch_stride < -1) fail("kernel ", op, ": negative kv_batch_stride ", kv_batch_stride);
  const int64_t kv_batch = kv_batch_stride == -1 ? checked_mul(op, Tk, kv_at.row) : kv_batch_stride;
  expect_q_heads(op, q, d, q_at);
  expect_kv_heads(op, k, d, Tk, kv_batch, kv_at, D.qk);
  expect_kv_heads(op, v, d, Tk, kv_batch, kv_at, D.v);
  expect_dtype(q.t.dtype(), op, {&out, &k.t, &v.t});
  expect_dtype(lse_dtype(q.t.dtype()), op, {&lse});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    if (is_half(q.t.dtype())) {
      expect_flash(op, q.t.dtype(), d,
                   {element_address(q), element_address(k), element_address(v), element_address(out), q_at.row,
                    q_at.group, kv_at.row, kv_at.group, kv_batch});
      return cuda::flash_attention_forward(ctx, out, lse, q, k, v, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale, pos_offset,
                                           kv_batch);
    }
    return cuda::attention_forward(ctx, out, lse, q, k, v, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale, pos_offset,
                                   kv_batch);
#endif
    fail_no_backend(ctx, op);
  }
  if (q.t.dtype() == DType::BF16)
    return cpu::attention_forward_bf16(out.data<BFloat16>(), lse.data<float>(), q.t.data<BFloat16>() + q.offset,
                                       k.t.data<BFloat16>() + k.offset, v.t.data<BFloat16>() + v.offset, B, Tlen, Hq,
                                       Hkv, D, q_at, kv_at, scale, pos_offset, kv_batch);
  dispatch_cpu_float(q.t.dtype(), op, [&]<typename T>(T) {
    cpu::attention_forward(out.data<T>(), lse.data<T>(), q.t.data<T>() + q.offset, k.t.data<T>() + k.offset,
                           v.t.data<T>() + v.offset, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale, pos_offset, kv_batch);
  });
}

void decode_attention(const ExecContext& ctx, const Tensor& out, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                      int64_t Tq, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                      int64_t Tk, int64_t kv_batch_stride) {
  constexpr std::string_view op = "decode_attention";
  expect_on_device(ctx, op, {&out, &q.t, &k.t, &v.t});
  const AttentionDims d{B, Tq, Hq, Hkv, D};
  check_dims(op, d, 0);
  if (Tq < 1 || Tk < Tq || kv_batch_stride < 0)
    fail("kernel ", op, ": ", Tq, " new tokens, ", Tk, " cached tokens and kv_batch_stride ", kv_batch_stride,
         " (at least one new token, all of them cached, a stride >= 0)");
  const int64_t rows = checked_mul(op, B, Tq), cols = checked_mul(op, Hq, D.v);
  checked_mul(op, rows, cols);
  expect_matrix(op, out, rows, cols);
  expect_q_heads(op, q, d, q_at);
  expect_kv_heads(op, k, d, Tk, kv_batch_stride, kv_at, D.qk);
  expect_kv_heads(op, v, d, Tk, kv_batch_stride, kv_at, D.v);
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  expect_dtype(q.t.dtype(), op, {&out});
  expect_dtype(k.t.dtype(), op, {&v.t});
  const auto run = [&]<typename T, typename KV>(T, KV) {
    cpu::decode_attention(out.data<T>(), q.t.data<T>() + q.offset, k.t.data<KV>() + k.offset, v.t.data<KV>() + v.offset,
                          B, Tq, Hq, Hkv, D, q_at, kv_at, scale, Tk, kv_batch_stride);
  };
  if (k.t.dtype() == DType::BF16 && q.t.dtype() == DType::F32) return run(float{}, BFloat16{});
  expect_dtype(q.t.dtype(), op, {&k.t});
  dispatch_cpu_float(q.t.dtype(), op, [&]<typename T>(T) { run(T{}, T{}); });
}

void paged_decode_attention(const ExecContext& ctx, const Tensor& out, TensorAt q, const Tensor& k_pages,
                            const Tensor& v_pages, const Tensor& pages, const Tensor& lens, int64_t B, int64_t Tq,
                            int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                            const Tensor& k_scale, const Tensor& v_scale) {
  constexpr std::string_view op = "paged_decode_attention";
  expect_on_device(ctx, op, {&out, &q.t, &k_pages, &v_pages, &pages, &lens});
  const AttentionDims d{B, Tq, Hq, Hkv, D};
  check_dims(op, d, 0);
  if (Tq < 1) fail("kernel ", op, ": ", Tq, " new tokens per row (at least one)");
  if (k_pages.dim() != 3 || v_pages.shape() != k_pages.shape())
    fail("kernel ", op, ": k and v pages must be [pages, page_size, cols] alike, got ", shape_str(k_pages.shape()),
         " and ", shape_str(v_pages.shape()));
  const int64_t num_pages = k_pages.size(0), page_size = k_pages.size(1);
  const int64_t widest = std::max(D.qk, D.v);
  if (kv_at.row != k_pages.size(2) || (Hkv - 1) * kv_at.group + widest > kv_at.row)
    fail("kernel ", op, ": ", Hkv, " kv heads of ", widest, " at stride ", kv_at.group, " do not fit rows of ",
         k_pages.size(2), " (kv_at.row ", kv_at.row, ")");
  if (pages.dim() != 2 || pages.size(0) != B || pages.dtype() != DType::I32)
    fail("kernel ", op, ": pages must be I32 [", B, ", max_pages], got ", dtype_name(pages.dtype()), " ",
         shape_str(pages.shape()));
  expect_matrix(op, lens, 1, B);
  expect_dtype(DType::I64, op, {&lens});
  const int64_t max_pages = pages.size(1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens.data<int64_t>()[b];
    if (n < Tq || n > checked_mul(op, max_pages, page_size))
      fail("kernel ", op, ": row ", b, " attends over ", n, " tokens; its ", Tq, " new ones and ", max_pages,
           " pages of ", page_size, " need ", Tq, " to ", max_pages * page_size);
    for (int64_t i = 0; i < (n + page_size - 1) / page_size; ++i) {
      const int32_t page = pages.data<int32_t>()[b * max_pages + i];
      if (page < 0 || page >= num_pages)
        fail("kernel ", op, ": row ", b, " page ", i, " is ", page, ", outside the pool's ", num_pages, " pages");
    }
  }
  expect_matrix(op, out, checked_mul(op, B, Tq), checked_mul(op, Hq, D.v));
  expect_q_heads(op, q, d, q_at);
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  expect_dtype(q.t.dtype(), op, {&out});
  expect_dtype(k_pages.dtype(), op, {&v_pages});
  const auto run = [&]<typename T, typename KV>(T, KV) {
    cpu::paged_decode_attention(out.data<T>(), q.t.data<T>() + q.offset, k_pages.data<KV>(), v_pages.data<KV>(), B, Tq,
                                Hq, Hkv, D, q_at, kv_at, scale, pages.data<int32_t>(), max_pages, lens.data<int64_t>(),
                                page_size);
  };
  if (k_pages.dtype() == DType::BF16 && q.t.dtype() == DType::F32) return run(float{}, BFloat16{});
  if (k_pages.dtype() == DType::F8E4M3 && q.t.dtype() == DType::F32) {
    // Scale blocks per head: 1, or a divisor of D.qk with the values inside the keys' blocks.
    const int64_t blocks = k_scale.defined() && k_scale.dim() == 3 ? k_scale.size(2) / Hkv : 0;
    const Shape want{num_pages, page_size, Hkv * std::max<int64_t>(blocks, 1)};
    for (const Tensor* s : {&k_scale, &v_scale})
      if (!s->defined() || s->dtype() != DType::F32 || s->shape() != want || blocks < 1)
        fail("kernel ", op, ": F8E4M3 pages need F32 scales [", num_pages, ", ", page_size, ", ", Hkv,
             " x blocks per head], got ",
             s->defined() ? std::string(dtype_name(s->dtype())) + " " + shape_str(s->shape()) : "none");
    if (blocks > 1 && (D.qk % blocks != 0 || D.v > D.qk))
      fail("kernel ", op, ": ", blocks, " scale blocks per head do not split keys of ", D.qk, " (values of ", D.v,
           " must lie within them)");
    cpu::paged_decode_attention(out.data<float>(), q.t.data<float>() + q.offset, k_pages.data<Float8E4M3>(),
                                v_pages.data<Float8E4M3>(), B, Tq, Hq, Hkv, D, q_at, kv_at, scale,
                                pages.data<int32_t>(), max_pages, lens.data<int64_t>(), page_size,
                                k_scale.data<float>(), v_scale.data<float>(), blocks);
    return;
  }
  expect_dtype(q.t.dtype(), op, {&k_pages});
  dispatch_cpu_float(q.t.dtype(), op, [&]<typename T>(T) { run(T{}, T{}); });
}

void attention_backward(const ExecContext& ctx, TensorAt dq, TensorAt dk, TensorAt dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                        int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                        double scale) {
  constexpr std::string_view op = "attention_backward";
  expect_on_device(ctx, op, {&dq.t, &dk.t, &dv.t, &dout, &out, &lse, &q.t, &k.t, &v.t});
  const AttentionDims d{B, Tlen, Hq, Hkv, D};
  check_dims(op, d, 0);
  check_outputs(op, d, {&dout, &out}, lse);
  const int64_t kv_batch = checked_mul(op, Tlen, kv_at.row);
  for (const TensorAt& t : {q, dq}) expect_q_heads(op, t, d, q_at);
  for (const TensorAt& t : {k, dk}) expect_kv_heads(op, t, d, Tlen, kv_batch, kv_at, D.qk);
  for (const TensorAt& t : {v, dv}) expect_kv_heads(op, t, d, Tlen, kv_batch, kv_at, D.v);
  expect_dtype(q.t.dtype(), op, {&dq.t, &dk.t, &dv.t, &dout, &out, &k.t, &v.t});
  expect_dtype(lse_dtype(q.t.dtype()), op, {&lse});
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    if (is_half(q.t.dtype())) {
      expect_flash(op, q.t.dtype(), d,
                   {element_address(q), element_address(k), element_address(v), element_address(dq),
                    element_address(dk), element_address(dv), element_address(out), element_address(dout), q_at.row,
                    q_at.group, kv_at.row, kv_at.group});
      return cuda::flash_attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v, B, Tlen, Hq, Hkv, D, q_at,
                                            kv_at, scale);
    }
    return cuda::attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale);
#endif
    fail_no_backend(ctx, op);
  }
  if (q.t.dtype() == DType::BF16)
    return cpu::attention_backward_bf16(
        dq.t.data<BFloat16>() + dq.offset, dk.t.data<BFloat16>() + dk.offset, dv.t.data<BFloat16>() + dv.offset,
        dout.data<BFloat16>(), out.data<BFloat16>(), lse.data<float>(), q.t.data<BFloat16>() + q.offset,
        k.t.data<BFloat16>() + k.offset, v.t.data<BFloat16>() + v.offset, B, Tlen, Hq, Hkv, D, q_at, kv_at, scale);
  dispatch_cpu_float(q.t.dtype(), op, [&]<typename T>(T) {
    cpu::attention_backward(dq.t.data<T>() + dq.offset, dk.t.data<T>() + dk.offset, dv.t.data<T>() + dv.offset,
                            dout.data<T>(), out.data<T>(), lse.data<T>(), q.t.data<T>() + q.offset,
                            k.t.data<T>() + k.offset, v.t.data<T>() + v.offset, B, Tlen, Hq, Hkv, D, q_at, kv_at,
                            scale);
  });
}

}  // namespace megaton::kernels
