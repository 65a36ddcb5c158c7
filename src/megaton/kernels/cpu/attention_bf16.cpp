#include "megaton/kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/fast_exp.h"
#include "megaton/kernels/cpu/gemm.h"

namespace megaton::kernels::cpu {
namespace {

using detail::fast_exp;
using B16 = BFloat16;

// Query rows per block. The block's scores against every key it sees are one GEMM; the causal mask
// wastes the upper half of the diagonal block, so smaller blocks waste less but run smaller GEMMs
// (more calls, each with a fixed cost). 128 measured fastest of 64 / 128 / 256 at gpt2-124m's
// T = 256, D = 64 on an AMX core (docs/performance.md).
constexpr int64_t kBlock = 128;

// rows x cols elements, `stride` apart in src, packed contiguously into dst: the GEMMs take
// contiguous operands, while q, k and v lie inside fused QKV rows. Not cpu::copy_rows: that one
// opens a parallel region, and these copies run inside the tasks' region, one per thread.
void pack_rows(B16* dst, const B16* src, int64_t rows, int64_t cols, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * cols, src + r * stride, cols * sizeof(B16));
}

// c [M, N] f32 = op(a) op(b), or += with accumulate; bf16 operands stored contiguously, a transposed
// one as its [K, M] / [N, K] transpose. Called inside the tasks' parallel region, so each GEMM runs
// on its task's thread.
void mm(float* c, const B16* a, bool ta, const B16* b, bool tb, int64_t M, int64_t N, int64_t K, bool accumulate) {
  gemm({M, N, K, DType::BF16, {a, ta}, {b, tb}, c, DType::F32, accumulate});
}

// Grows v to n elements; buffers are thread_local and reused across calls, so a step does not
// allocate (and the kernel zero) them again for every layer.
template <typename T>
T* room(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// A thread's contiguous copies of one kv head: k [Tk, D.qk] and v [Tk, D.v]. `from` remembers which
// head they hold, so the query heads of one group that follow each other on a thread copy it once.
struct KvCopy {
  std::vector<B16> k, v;
  const B16* from = nullptr;
  void load(const B16* k_src, const B16* v_src, int64_t stride, int64_t Tk, HeadDim D) {
    if (from == k_src) return;
    pack_rows(room(k, Tk * D.qk), k_src, Tk, D.qk, stride);
    pack_rows(room(v, Tk * D.v), v_src, Tk, D.v, stride);
    from = k_src;
  }
};

// Per-thread buffers of one query block: q rows, scores (f32), probabilities (bf16) and the output
// (f32) of the forward.
struct ForwardScratch {
  void reserve(int64_t Tk, HeadDim D) {
    room(q, kBlock * D.qk), room(s, kBlock * Tk), room(p, kBlock * Tk), room(o, kBlock * D.v);
    room(inv_sum, kBlock);
    kv.from = nullptr;
  }
  KvCopy kv;
  std::vector<B16> q;
  std::vector<float> s;
  std::vector<B16> p;
  std::vector<float> o, inv_sum;
};

// Row i of a block whose scores s [n] see keys [0, visible): the unnormalised probabilities
// exp(scale * s - max) rounded to bf16 into p (zero past `visible`); returns their fp32 sum and sets
// max to the row's largest scaled score.
float softmax_row(B16* p, const float* s, int64_t n, int64_t visible, float scale, float& max) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < visible; ++j) m = std::max(m, s[j] * scale);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < visible; ++j) {
    const float e = fast_exp(s[j] * scale - m);
    sum += e;
    p[j] = store<B16>(e);
  }
  std::fill(p + visible, p + n, B16{});
  max = m;
  return sum;
}

// One (batch, query head): q rows at q_stride, out rows at out_stride, lse[Tlen]; the kv head already
// in w.kv. Query t sits at position pos_offset + t and sees keys [0, pos_offset + t].
void forward_head(B16* out, int64_t out_stride, float* lse, const B16* q, int64_t q_stride, int64_t Tlen,
                  int64_t pos_offset, HeadDim D, float scale, ForwardScratch& w) {
  for (int64_t i0 = 0; i0 < Tlen; i0 += kBlock) {
    const int64_t rows = std::min(kBlock, Tlen - i0), nk = pos_offset + i0 + rows;
    pack_rows(w.q.data(), q + i0 * q_stride, rows, D.qk, q_stride);
    mm(w.s.data(), w.q.data(), false, w.kv.k.data(), true, rows, nk, D.qk, false);  // S = Q K^T
    for (int64_t i = 0; i < rows; ++i) {
      float max = 0;
      const float sum = softmax_row(w.p.data() + i * nk, w.s.data() + i * nk, nk, pos_offset + i0 + i + 1, scale, max);
      w.inv_sum[i] = 1.0f / sum;
      lse[i0 + i] = max + std::log(sum);
    }
    mm(w.o.data(), w.p.data(), false, w.kv.v.data(), false, rows, D.v, nk, false);  // O = P V
    for (int64_t i = 0; i < rows; ++i) {
      B16* oi = out + (i0 + i) * out_stride;
      const float* src = w.o.data() + i * D.v;
#pragma omp simd
      for (int64_t d = 0; d < D.v; ++d) oi[d] = store<B16>(src[d] * w.inv_sum[i]);
    }
  }
}

struct BackwardScratch {
  void reserve(int64_t Tlen, HeadDim D) {
    room(dk, Tlen * D.qk), room(dv, Tlen * D.v), room(q, kBlock * D.qk), room(dout, kBlock * D.v);
    room(s, kBlock * Tlen), room(dp, kBlock * Tlen), room(p, kBlock * Tlen), room(ds, kBlock * Tlen);
    room(dq, kBlock * D.qk), room(di, kBlock);
    kv.from = nullptr;
  }
  KvCopy kv;
  std::vector<float> dk, dv;  // the kv head's gradient sums over its query group (dk without the scale)
  std::vector<B16> q, dout;   // one query block's rows, packed
  std::vector<float> s, dp;   // its scores and dO V^T
  std::vector<B16> p, ds;     // its probabilities and dS, the GEMM operands
  std::vector<float> dq, di;  // its dQ (without the scale) and rowsum(dO * O)
};

// One query head's rows in q, out, dout and dq, and its lse[Tlen].
struct HeadRows {
  const B16 *q, *o, *dout;
  const float* lse;
  B16* dq;
};

// One query head's share of the backward: writes its dq rows and adds its contributions to the
// group's sums w.dk and w.dv; the kv head already in w.kv.
void backward_head(const HeadRows& h, int64_t q_stride, int64_t o_stride, int64_t Tlen, HeadDim D, float scale,
                   BackwardScratch& w) {
  for (int64_t i0 = 0; i0 < Tlen; i0 += kBlock) {
    const int64_t rows = std::min(kBlock, Tlen - i0), nk = i0 + rows;
    pack_rows(w.q.data(), h.q + i0 * q_stride, rows, D.qk, q_stride);
    pack_rows(w.dout.data(), h.dout + i0 * o_stride, rows, D.v, o_stride);
    for (int64_t i = 0; i < rows; ++i) {
      const B16 *o_i = h.o + (i0 + i) * o_stride, *dout_i = w.dout.data() + i * D.v;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < D.v; ++d) sum += load(o_i[d]) * load(dout_i[d]);
      w.di[i] = sum;
    }
    mm(w.s.data(), w.q.data(), false, w.kv.k.data(), true, rows, nk, D.qk, false);     // S = Q K^T
    mm(w.dp.data(), w.dout.data(), false, w.kv.v.data(), true, rows, nk, D.v, false);  // dP = dO V^T
    for (int64_t i = 0; i < rows; ++i) {
      // P = exp(scale * S - lse), the forward's softmax rebuilt; dS = P * (dP - Di), its backward.
      const int64_t visible = i0 + i + 1;
      const float lse_i = h.lse[i0 + i], di = w.di[i];
      const float *s = w.s.data() + i * nk, *dp = w.dp.data() + i * nk;
      B16 *p = w.p.data() + i * nk, *ds = w.ds.data() + i * nk;
#pragma omp simd
      for (int64_t j = 0; j < visible; ++j) {
        const float pj = fast_exp(s[j] * scale - lse_i);
        p[j] = store<B16>(pj);
        ds[j] = store<B16>(pj * (dp[j] - di));
      }
      std::fill(p + visible, p + nk, B16{});
      std::fill(ds + visible, ds + nk, B16{});
    }
    mm(w.dv.data(), w.p.data(), true, w.dout.data(), false, nk, D.v, rows, true);      // dV += P^T dO
    mm(w.dq.data(), w.ds.data(), false, w.kv.k.data(), false, rows, D.qk, nk, false);  // dQ = dS K
    mm(w.dk.data(), w.ds.data(), true, w.q.data(), false, nk, D.qk, rows, true);       // dK += dS^T Q
    for (int64_t i = 0; i < rows; ++i) {
      B16* dq_i = h.dq + (i0 + i) * q_stride;
      const float* src = w.dq.data() + i * D.qk;
#pragma omp simd
      for (int64_t d = 0; d < D.qk; ++d) dq_i[d] = store<B16>(scale * src[d]);
    }
  }
}

}  // namespace

void attention_forward_bf16(BFloat16* out, float* lse, const BFloat16* q, const BFloat16* k, const BFloat16* v,
                            int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at,
                            HeadStrides kv_at, double scale, int64_t pos_offset, int64_t kv_batch_stride) {
  MEGATON_CHECK(Hkv > 0 && Hq % Hkv == 0, "attention_forward_bf16: Hq=", Hq, " is not a multiple of Hkv=", Hkv);
  MEGATON_CHECK(pos_offset >= 0, "attention_forward_bf16: negative pos_offset ", pos_offset);
  const int64_t Tk = pos_offset + Tlen;
  if (kv_batch_stride < 0) kv_batch_stride = Tk * kv_at.row;
  const int64_t group = Hq / Hkv, out_stride = Hq * D.v;
#pragma omp parallel
  {
    thread_local ForwardScratch w;
    w.reserve(Tk, D);
    // Tasks in (batch, query head) order: the heads of one group are consecutive, so a thread's
    // consecutive tasks mostly share their kv head (KvCopy::load copies it once).
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hq; ++task) {
      const int64_t b = task / Hq, h = task % Hq, g = h / group;
      const int64_t q_off = b * Tlen * q_at.row + g * q_at.group + (h - g * group) * D.qk;
      const int64_t kv_off = b * kv_batch_stride + g * kv_at.group;
      w.kv.load(k + kv_off, v + kv_off, kv_at.row, Tk, D);
      forward_head(out + b * Tlen * out_stride + h * D.v, out_stride, lse + task * Tlen, q + q_off, q_at.row, Tlen,
                   pos_offset, D, static_cast<float>(scale), w);
    }
  }
}

void attention_backward_bf16(BFloat16* dq, BFloat16* dk, BFloat16* dv, const BFloat16* dout, const BFloat16* out,
                             const float* lse, const BFloat16* q, const BFloat16* k, const BFloat16* v, int64_t B,
                             int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                             double scale) {
  MEGATON_CHECK(Hkv > 0 && Hq % Hkv == 0, "attention_backward_bf16: Hq=", Hq, " is not a multiple of Hkv=", Hkv);
  const int64_t group = Hq / Hkv, o_stride = Hq * D.v;
  const float scale_f = static_cast<float>(scale);
  // One task per (batch, kv head), as the f32 kernel: it owns that head's dk / dv rows and the dq rows
  // of its query group, so no two tasks write the same memory and no sum depends on the threads.
#pragma omp parallel
  {
    thread_local BackwardScratch w;
    w.reserve(Tlen, D);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hkv; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv;
      const int64_t kv_off = b * Tlen * kv_at.row + g * kv_at.group;
      w.kv.load(k + kv_off, v + kv_off, kv_at.row, Tlen, D);
      std::fill_n(w.dk.begin(), Tlen * D.qk, 0.0f);
      std::fill_n(w.dv.begin(), Tlen * D.v, 0.0f);
      for (int64_t i = 0; i < group; ++i) {
        const int64_t h = g * group + i;
        const int64_t q_off = b * Tlen * q_at.row + g * q_at.group + i * D.qk, o_off = b * Tlen * o_stride + h * D.v;
        const HeadRows head{q + q_off, out + o_off, dout + o_off, lse + (b * Hq + h) * Tlen, dq + q_off};
        backward_head(head, q_at.row, o_stride, Tlen, D, scale_f, w);
      }
      for (int64_t t = 0; t < Tlen; ++t) {
        B16 *dk_t = dk + kv_off + t * kv_at.row, *dv_t = dv + kv_off + t * kv_at.row;
        for (int64_t d = 0; d < D.qk; ++d) dk_t[d] = store<B16>(scale_f * w.dk[t * D.qk + d]);
        for (int64_t d = 0; d < D.v; ++d) dv_t[d] = store<B16>(w.dv[t * D.v + d]);
      }
    }
  }
}

}  // namespace megaton::kernels::cpu
