#include "megaton/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/fast_exp.h"
#include "megaton/kernels/cpu/online_softmax.h"

namespace megaton::kernels::cpu {
namespace {

using detail::fast_exp;

// Query rows and keys per tile. A 64 x 64 float score tile is 16 KiB and stays in L1 while it is
// multiplied with V (forward) or turned into dS (backward).
constexpr int64_t kTile = 64;

// Row stride of a transposed head of Tk keys: whole tiles, plus 16 elements (a cache line of floats) so
// that consecutive rows do not map to the same few L1 sets (with a power-of-two stride the 64 rows of
// a tile evict each other).
int64_t transposed_ld(int64_t Tk) { return (Tk + kTile - 1) / kTile * kTile + kTile / 4; }

// Products of small tiles: c[M, N] += a(M, K) * b[K, N], where b and c have contiguous rows and
// a(m, k) = a[m * a_rs + k * a_cs]: a_cs = 1 reads a row-major tile, a_rs = 1 its transpose, so
// products with a transposed tile need no copy. Every matrix product of the forward and backward
// is one of these.

// One 64-byte SIMD register of T (GCC/Clang vector extension), loaded and stored with memcpy
// (unaligned). The auto-vectoriser keeps the accumulators of an outer-product loop in memory; these
// keep them in registers.
template <typename T>
using Vec [[gnu::vector_size(64)]] = T;
template <typename T>
constexpr int64_t kLanes = 64 / sizeof(T);

// R rows x V vectors of c, accumulated in registers over k: each step loads V vectors of b and R
// scalars of a for R * V fused multiply-adds.
template <int R, int V, typename T>
void gemm_block(T* c, int64_t ldc, const T* a, int64_t a_rs, int64_t a_cs, const T* b, int64_t ldb, int64_t K) {
  constexpr int64_t L = kLanes<T>;
  Vec<T> acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) std::memcpy(&acc[r][v], c + r * ldc + v * L, sizeof(Vec<T>));
  for (int64_t k = 0; k < K; ++k) {
    Vec<T> bk[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) std::memcpy(&bk[v], b + k * ldb + v * L, sizeof(Vec<T>));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const T ark = a[r * a_rs + k * a_cs];
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] += ark * bk[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) std::memcpy(c + r * ldc + v * L, &acc[r][v], sizeof(Vec<T>));
}

// The last N < kLanes columns of R rows (e.g. D = 24 in float), auto-vectorised with c in memory.
template <int R, typename T>
void gemm_tail(T* c, int64_t ldc, const T* a, int64_t a_rs, int64_t a_cs, const T* b, int64_t ldb, int64_t N,
               int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    T ak[R];
    for (int r = 0; r < R; ++r) ak[r] = a[r * a_rs + k * a_cs];
    const T* bk = b + k * ldb;
#pragma omp simd
    for (int64_t n = 0; n < N; ++n)
      for (int r = 0; r < R; ++r) c[r * ldc + n] += ak[r] * bk[n];
  }
}

template <int R, typename T>
void gemm_rows(T* c, int64_t ldc, const T* a, int64_t a_rs, int64_t a_cs, const T* b, int64_t ldb, int64_t N,
               int64_t K) {
  constexpr int64_t L = kLanes<T>, kWide = 4;  // 4 rows x 4 vectors: 16 accumulators of 32 registers
  int64_t n = 0;
  for (; n + kWide * L <= N; n += kWide * L) gemm_block<R, kWide>(c + n, ldc, a, a_rs, a_cs, b + n, ldb, K);
  for (; n + L <= N; n += L) gemm_block<R, 1>(c + n, ldc, a, a_rs, a_cs, b + n, ldb, K);
  if (n < N) gemm_tail<R>(c + n, ldc, a, a_rs, a_cs, b + n, ldb, N - n, K);
}

template <typename T>
void gemm_acc(T* c, int64_t ldc, const T* a, int64_t a_rs, int64_t a_cs, const T* b, int64_t ldb, int64_t M, int64_t N,
              int64_t K) {
  constexpr int kRows = 4;
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows) gemm_rows<kRows>(c + m * ldc, ldc, a + m * a_rs, a_rs, a_cs, b, ldb, N, K);
  for (; m < M; ++m) gemm_rows<1>(c + m * ldc, ldc, a + m * a_rs, a_rs, a_cs, b, ldb, N, K);
}

// dst[d, t] = src[t * stride + d] for t < Tk and 0 for Tk <= t < ld. Keys become contiguous so that
// score tiles vectorise over keys; the zero padding to whole tiles keeps padded scores finite (they
// are always masked).
template <typename T>
void transpose_head(T* dst, int64_t ld, const T* src, int64_t stride, int64_t Tk, int64_t D) {
  for (int64_t t = 0; t < Tk; ++t)
    for (int64_t d = 0; d < D; ++d) dst[d * ld + t] = src[t * stride + d];
  for (int64_t d = 0; d < D; ++d) std::fill(dst + d * ld + Tk, dst + (d + 1) * ld, T(0));
}

// s[i, j] = scale * q_i . k_{j0+j} for `rows` queries and kTile keys, or -inf where key j0 + j comes
// after query i's absolute position pos0 + i (causal mask; it also covers the padding past the last key).
// kt is the transposed key head from transpose_head.
template <typename T>
void score_tile(T* s, const T* q, int64_t q_stride, const T* kt, int64_t ld_kt, int64_t rows, int64_t j0, int64_t pos0,
                int64_t D, T scale) {
  std::fill(s, s + rows * kTile, T(0));
  gemm_acc(s, kTile, q, q_stride, 1, kt + j0, ld_kt, rows, kTile, D);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t visible = pos0 + i + 1 - j0;  // keys j < visible of this tile are visible to query i
    T* si = s + i * kTile;
#pragma omp simd
    for (int64_t j = 0; j < kTile; ++j) si[j] = j < visible ? si[j] * scale : kNegInf;
  }
}

// Per-thread buffers, reused across the tasks a thread runs.
template <typename T>
struct ForwardScratch {
  ForwardScratch(HeadDim D, int64_t ld)
      : kt(D.qk * ld), s(kTile * kTile), acc(kTile * D.v), m(kTile), l(kTile) {}
  std::vector<T> kt, s, acc, m, l;  // K^T [D.qk, ld], score tile, and the running softmax state per row
};

// One (batch, query head): q rows at q_stride, k/v rows (Tk = pos_offset + Tlen of them) at kv_stride,
// out rows at out_stride, lse[Tlen].
template <typename T>
void forward_head(T* out, int64_t out_stride, T* lse, const T* q, int64_t q_stride, const T* k, const T* v,
                  int64_t kv_stride, int64_t Tlen, int64_t pos_offset, HeadDim D, T scale, ForwardScratch<T>& w) {
  const int64_t Tk = pos_offset + Tlen, ld = transposed_ld(Tk);
  transpose_head(w.kt.data(), ld, k, kv_stride, Tk, D.qk);
  for (int64_t i0 = 0; i0 < Tlen; i0 += kTile) {
    const int64_t rows = std::min(kTile, Tlen - i0), pos0 = pos_offset + i0;
    const int64_t key_end = pos0 + rows;  // keys [0, key_end) are visible to some row of this tile
    std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<T>::infinity());
    std::fill(w.l.begin(), w.l.end(), T(0));
    std::fill(w.acc.begin(), w.acc.end(), T(0));
    for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
      score_tile(w.s.data(), q + i0 * q_stride, q_stride, w.kt.data(), ld, rows, j0, pos0, D.qk, scale);
      online_softmax_step(w.s.data(), kTile, kTile, w.m.data(), w.l.data(), w.acc.data(), rows, D.v);
      gemm_acc(w.acc.data(), D.v, w.s.data(), kTile, 1, v + j0 * kv_stride, kv_stride, rows, D.v,
               std::min(kTile, key_end - j0));
    }
    for (int64_t i = 0; i < rows; ++i) {
      const T inv_l = T(1) / w.l[i];
      T* oi = out + (i0 + i) * out_stride;
      for (int64_t d = 0; d < D.v; ++d) oi[d] = w.acc[i * D.v + d] * inv_l;
      lse[i0 + i] = w.m[i] + std::log(w.l[i]);
    }
  }
}

template <typename T>
struct BackwardScratch {
  BackwardScratch(int64_t Tlen, HeadDim D, int64_t ld)
      : kt(D.qk * ld),
        vt(D.v * ld),
        dk(Tlen * D.qk),
        dv(Tlen * D.v),
        p(kTile * kTile),
        ds(kTile * kTile),
        dq(kTile * D.qk),
        di(kTile) {}
  std::vector<T> kt, vt;  // the kv head transposed, [D.qk, ld] and [D.v, ld]
  std::vector<T> dk, dv;  // the kv head's gradient sums over its query group, [Tlen, D.qk] and [Tlen, D.v]
  std::vector<T> p, ds;   // probability and dS tiles
  std::vector<T> dq, di;  // one query tile's dQ sum and rowsum(dO * O)
};

// One query head's rows in q, out, dout and dq, and its lse[Tlen].
template <typename T>
struct HeadRows {
  const T *q, *o, *dout, *lse;
  T* dq;
};

// One query head's share of the backward: writes its dq rows and adds its contributions to the
// group's sums w.dk (without the final scale) and w.dv. k is the group's kv head; w.kt / w.vt hold k
// and v transposed.
template <typename T>
void backward_head(const HeadRows<T>& h, int64_t q_stride, int64_t o_stride, const T* k, int64_t kv_stride,
                   int64_t Tlen, HeadDim D, T scale, BackwardScratch<T>& w) {
  const int64_t ld = transposed_ld(Tlen);
  for (int64_t i0 = 0; i0 < Tlen; i0 += kTile) {
    const int64_t rows = std::min(kTile, Tlen - i0);
    const T* qi = h.q + i0 * q_stride;
    const T* doi = h.dout + i0 * o_stride;
    for (int64_t i = 0; i < rows; ++i) {
      const T *o_i = h.o + (i0 + i) * o_stride, *dout_i = doi + i * o_stride;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < D.v; ++d) sum += o_i[d] * dout_i[d];
      w.di[i] = sum;
    }
    std::fill(w.dq.begin(), w.dq.end(), T(0));
    for (int64_t j0 = 0; j0 < i0 + rows; j0 += kTile) {
      const int64_t nk = std::min(kTile, i0 + rows - j0);  // keys of this tile visible to some row
      // P = exp(scale * q k - lse): the forward softmax, rebuilt instead of stored.
      T* p = w.p.data();
      score_tile(p, qi, q_stride, w.kt.data(), ld, rows, j0, i0, D.qk, scale);
      for (int64_t i = 0; i < rows; ++i) {
        const T lse_i = h.lse[i0 + i];
#pragma omp simd
        for (int64_t j = 0; j < kTile; ++j) p[i * kTile + j] = fast_exp(p[i * kTile + j] - lse_i);
      }
      // dS = P * (dO v - Di), the softmax backward.
      T* ds = w.ds.data();
      std::fill(w.ds.begin(), w.ds.end(), T(0));
      gemm_acc(ds, kTile, doi, o_stride, 1, w.vt.data() + j0, ld, rows, kTile, D.v);
      for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
        for (int64_t j = 0; j < kTile; ++j) ds[i * kTile + j] = p[i * kTile + j] * (ds[i * kTile + j] - w.di[i]);
      }
      gemm_acc(w.dv.data() + j0 * D.v, D.v, p, 1, kTile, doi, o_stride, nk, D.v, rows);             // dV += P^T dO
      gemm_acc(w.dq.data(), D.qk, ds, kTile, 1, k + j0 * kv_stride, kv_stride, rows, D.qk, nk);  // dQ += dS K
      gemm_acc(w.dk.data() + j0 * D.qk, D.qk, ds, 1, kTile, qi, q_stride, nk, D.qk, rows);         // dK += dS^T Q
    }
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t d = 0; d < D.qk; ++d) h.dq[(i0 + i) * q_stride + d] = scale * w.dq[i * D.qk + d];
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t B, int64_t Tlen, int64_t Hq,
                       int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale, int64_t pos_offset,
                       int64_t kv_batch_stride) {
  MEGATON_CHECK(Hkv > 0 && Hq % Hkv == 0, "attention_forward: Hq=", Hq, " is not a multiple of Hkv=", Hkv);
  MEGATON_CHECK(pos_offset >= 0, "attention_forward: negative pos_offset ", pos_offset);
  if (kv_batch_stride < 0) kv_batch_stride = (pos_offset + Tlen) * kv_at.row;
  const int64_t group = Hq / Hkv, out_stride = Hq * D.v, ld = transposed_ld(pos_offset + Tlen);
#pragma omp parallel
  {
    ForwardScratch<T> w(D, ld);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hq; ++task) {
      const int64_t b = task / Hq, h = task % Hq, g = h / group;
      const int64_t q_off = b * Tlen * q_at.row + g * q_at.group + (h - g * group) * D.qk;
      const int64_t kv_off = b * kv_batch_stride + g * kv_at.group;
      forward_head(out + b * Tlen * out_stride + h * D.v, out_stride, lse + task * Tlen, q + q_off, q_at.row, k + kv_off,
                   v + kv_off, kv_at.row, Tlen, pos_offset, D, static_cast<T>(scale), w);
    }
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at,
                        HeadStrides kv_at, double scale) {
  MEGATON_CHECK(Hkv > 0 && Hq % Hkv == 0, "attention_backward: Hq=", Hq, " is not a multiple of Hkv=", Hkv);
  const int64_t group = Hq / Hkv, o_stride = Hq * D.v, ld = transposed_ld(Tlen);
  const T scale_t = static_cast<T>(scale);
  // One task per (batch, kv head): it owns that head's dk/dv rows and the dq rows of its query group,
  // so no two tasks write the same memory and the summation order never depends on the threads.
#pragma omp parallel
  {
    BackwardScratch<T> w(Tlen, D, ld);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hkv; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv;
      const int64_t kv_off = b * Tlen * kv_at.row + g * kv_at.group;
      transpose_head(w.kt.data(), ld, k + kv_off, kv_at.row, Tlen, D.qk);
      transpose_head(w.vt.data(), ld, v + kv_off, kv_at.row, Tlen, D.v);
      std::fill(w.dk.begin(), w.dk.end(), T(0));
      std::fill(w.dv.begin(), w.dv.end(), T(0));
      for (int64_t i = 0; i < group; ++i) {
        const int64_t h = g * group + i;
        const int64_t q_off = b * Tlen * q_at.row + g * q_at.group + i * D.qk, o_off = b * Tlen * o_stride + h * D.v;
        const HeadRows<T> head{q + q_off, out + o_off, dout + o_off, lse + (b * Hq + h) * Tlen, dq + q_off};
        backward_head(head, q_at.row, o_stride, k + kv_off, kv_at.row, Tlen, D, scale_t, w);
      }
      for (int64_t t = 0; t < Tlen; ++t) {
        T *dk_t = dk + kv_off + t * kv_at.row, *dv_t = dv + kv_off + t * kv_at.row;
        for (int64_t d = 0; d < D.qk; ++d) dk_t[d] = scale_t * w.dk[t * D.qk + d];
        for (int64_t d = 0; d < D.v; ++d) dv_t[d] = w.dv[t * D.v + d];
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                       int64_t, int64_t, HeadDim, HeadStrides, HeadStrides, double, int64_t, int64_t);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*, int64_t, int64_t,
                                        int64_t, int64_t, HeadDim, HeadStrides, HeadStrides, double, int64_t, int64_t);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, const float*, int64_t, int64_t, int64_t, int64_t, HeadDim,
                                        HeadStrides, HeadStrides, double);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                         int64_t, HeadDim, HeadStrides, HeadStrides, double);

}  // namespace megaton::kernels::cpu
