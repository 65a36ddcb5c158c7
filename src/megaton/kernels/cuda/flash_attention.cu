#include "megaton/kernels/cuda/flash_attention.h"

#include <cuda_fp16.h>

#include <type_traits>

#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/flash_attention_plan.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kQ = kFlashQTile, kKv = kFlashKvTile, kPad = kFlashPad;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// What differs between bf16 and fp16: packing two floats into one 32-bit register (the lower
// address in the low half, as a 32-bit load of two elements) and the tensor-core instruction.
template <typename T>
struct Half;
template <>
struct Half<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  // d += a b over one m16n8k16 tile: a row-major 16x16, b "col" (k-contiguous) 16x8, fp32 d.
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Half<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <typename T>
__device__ __forceinline__ uint32_t word(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements from shared memory, lane l giving the address of a row of
// matrix l / 8; register i holds matrix i, thread t its row t / 4, columns 2 (t % 4) and + 1
// (with .trans the matrix transposed: column t / 4, rows 2 (t % 4) and + 1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// Fragment layouts of m16n8k16 (PTX ISA), with g = lane / 4 and c = 2 * (lane % 4):
//   A (16x16): a[0] (row g, cols c, c+1), a[1] (row g+8, c), a[2] (row g, c+8), a[3] (row g+8, c+8);
//   B (16x8, k x n): b0 (k c, c+1; n g), b1 (k c+8, c+9; n g);
//   C (16x8): d[0], d[1] (row g, cols c, c+1), d[2], d[3] (row g+8, cols c, c+1).
// So the C tiles of n-columns 16i..16i+7 and 16i+8..16i+15 are, packed, the A tile of k-columns
// 16i..16i+15: P and dS go from one product into the next without leaving registers.

// The A tile at (row r0, col c0) of a row-major shared tile with `stride` elements a row: the four
// 8x8 quarters in a[0..3]'s order (rows 0-7 / 8-15 by lane % 16, columns 0-7 / 8-15 by lane / 16).
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int stride, int r0, int c0, int lane) {
  ldmatrix_x4(a, tile + (r0 + lane % 16) * stride + c0 + lane / 16 * 8);
}

// d0 += A B and d1 += A B' for the n-tiles at n0 and n0 + 8, B's k from k0, out of a shared tile that
// holds B transposed ([n][k], k contiguous: K for Q K^T, Q for K Q^T, ...).
template <typename T>
__device__ __forceinline__ void mma_nk(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], const T* tile,
                                       int stride, int n0, int k0, int lane) {
  uint32_t b[4];  // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
  ldmatrix_x4(b, tile + (n0 + lane % 8 + lane / 16 * 8) * stride + k0 + lane / 8 % 2 * 8);
  Half<T>::mma(d0, a, b[0], b[1]);
  Half<T>::mma(d1, a, b[2], b[3]);
}

// The same for a shared tile that holds B as it is ([k][n], n contiguous: V for P V, K for dS K, ...),
// read transposed by ldmatrix.
template <typename T>
__device__ __forceinline__ void mma_kn(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], const T* tile,
                                       int stride, int k0, int n0, int lane) {
  uint32_t b[4];  // (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), transposed
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + lane / 8 % 2 * 8) * stride + n0 + lane / 16 * 8);
  Half<T>::mma(d0, a, b[0], b[1]);
  Half<T>::mma(d1, a, b[2], b[3]);
}

// Two C tiles (n-columns 16i.. and 16i+8..) as the A tile of k-columns 16i..16i+15.
template <typename T>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = Half<T>::pack(lo[0], lo[1]);
  a[1] = Half<T>::pack(lo[2], lo[3]);
  a[2] = Half<T>::pack(hi[0], hi[1]);
  a[3] = Half<T>::pack(hi[2], hi[3]);
}

// 2^x by the SFU (ex2.approx: 2 ulp, subnormal results flushed to zero), what FlashAttention's
// --use_fast_math exp2f compiles to; -inf gives 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Starts copying a ROWS x COLS tile into shared memory (row-major, STRIDE elements a row) as 16-byte
// cp.async transfers; row r comes from src(r), or is zeros where src(r) is nullptr (a zero-byte
// source; `any` is some valid address for it). Completes with cp_async_wait.
template <typename T, int ROWS, int COLS, int STRIDE = COLS + kPad, typename Src>
__device__ __forceinline__ void stage(T* dst, const T* any, Src src) {
  constexpr int kVec = 8, kPerRow = COLS / kVec;
  for (int i = threadIdx.x; i < ROWS * kPerRow; i += kThreads) {
    const int r = i / kPerRow, c = i % kPerRow * kVec;
    const T* p = src(r);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst + r * STRIDE + c)),
                 "l"(p ? p + c : any), "r"(p ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` committed groups are still in flight (this thread's copies).
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

struct Params {
  const void *q, *k, *v, *dout;
  void *out, *dq, *dk, *dv;
  float* lse;
  const float* delta;
  int64_t Tlen, Tk, Hq, Hkv;
  HeadStrides q_at, kv_at;
  int64_t kv_batch, pos_offset;
  float scale, scale_log2;  // softmax scale, and times log2(e): the kernels exponentiate base 2
  int dqk, dv_dim;
  __device__ int64_t group_size() const { return Hq / Hkv; }
  __device__ int64_t q_index(int64_t b, int64_t t, int64_t h) const {
    return (b * Tlen + t) * q_at.row + h / group_size() * q_at.group + h % group_size() * dqk;
  }
  __device__ int64_t kv_index(int64_t b, int64_t j, int64_t g) const {
    return b * kv_batch + j * kv_at.row + g * kv_at.group;
  }
  __device__ int64_t out_index(int64_t b, int64_t t, int64_t h) const { return ((b * Tlen + t) * Hq + h) * dv_dim; }
  __device__ int64_t lse_index(int64_t b, int64_t t, int64_t h) const { return (b * Hq + h) * Tlen + t; }
};

// Forward: block (query tile, head h, batch row b), warp w owns query rows q0 + 16w .. +15. The K and
// V tiles are double-buffered: the next one loads (cp.async) while this one is multiplied. Q comes
// in, and the output goes out, through shared memory as whole rows (coalesced).
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(kThreads) forward_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kKs = kKv * (DQK + kPad), kVs = kKv * (DV + kPad), kOs = (DQK > DV ? DQK : DV) + kPad;
  T* ks = reinterpret_cast<T*>(smem);  // [2][kKv][DQK + kPad]
  T* vs = ks + 2 * kKs;                 // [2][kKv][DV + kPad]
  T* qs = vs + 2 * kVs;                 // [kQ][kOs]: Q, later the output
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
  const int64_t b = blockIdx.z, h = blockIdx.y, grp = h / p.group_size();
  const int64_t q0 = (gridDim.x - 1 - blockIdx.x) * int64_t{kQ};  // the longest causal rows first
  const int64_t r0 = q0 + 16 * warp;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int64_t last_row = min(q0 + kQ, p.Tlen) - 1;
  const int64_t key_end = min(p.Tk, p.pos_offset + last_row + 1);
  const int tiles = static_cast<int>((key_end + kKv - 1) / kKv);
  const auto load = [&](int tile) {
    const int64_t k0 = int64_t{tile} * kKv;
    T* kb = ks + (tile & 1) * kKs;
    T* vb = vs + (tile & 1) * kVs;
    stage<T, kKv, DQK>(kb, k, [&](int r) { return k0 + r < p.Tk ? k + p.kv_index(b, k0 + r, grp) : nullptr; });
    stage<T, kKv, DV>(vb, v, [&](int r) { return k0 + r < p.Tk ? v + p.kv_index(b, k0 + r, grp) : nullptr; });
    cp_async_commit();
  };
  stage<T, kQ, DQK, kOs>(qs, q, [&](int r) { return q0 + r < p.Tlen ? q + p.q_index(b, q0 + r, h) : nullptr; });
  load(0);  // one group with Q

  uint32_t qa[DQK / 16][4];  // this warp's 16 query rows, as A tiles; rows past Tlen are zeros
  float o[DV / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, base 2
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load(tile + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (tile == 0)
#pragma unroll
      for (int kc = 0; kc < DQK / 16; ++kc) load_a(qa[kc], qs, kOs, 16 * warp, kc * 16, lane);
    const T* kb = ks + (tile & 1) * kKs;
    const T* vb = vs + (tile & 1) * kVs;
    const int64_t k0 = int64_t{tile} * kKv;
    float s[kKv / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < DQK / 16; ++kc)
#pragma unroll
      for (int nt = 0; nt < kKv / 8; nt += 2) mma_nk(s[nt], s[nt + 1], qa[kc], kb, DQK + kPad, nt * 8, kc * 16, lane);
    // Only tiles that cross the diagonal or Tk are masked (a branch the whole warp takes alike):
    // key k0 + j is seen by row r0 + i when j <= pos_offset + r0 - k0 + i.
    if (k0 + kKv > p.pos_offset + r0 + 1 || k0 + kKv > p.Tk) {
      const int64_t seen = p.pos_offset + r0 + g - k0, inside = p.Tk - k0;
#pragma unroll
      for (int nt = 0; nt < kKv / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = nt * 8 + c + (i & 1);
          if (j > seen + (i >> 1) * 8 || j >= inside) s[nt][i] = -INFINITY;
        }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < kKv / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[nt][i] *= p.scale_log2;
        mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
      }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];  // a row that has seen no key yet stays at zero
      const float correction = fast_exp2(m[r] - base[r]);
      m[r] = mx[r];
      l[r] *= correction;
#pragma unroll
      for (int dn = 0; dn < DV / 8; ++dn) {
        o[dn][2 * r] *= correction;
        o[dn][2 * r + 1] *= correction;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kKv / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[nt][i] = fast_exp2(s[nt][i] - base[i >> 1]);
        l[i >> 1] += s[nt][i];
      }
#pragma unroll
    for (int kc = 0; kc < kKv / 16; ++kc) {
      uint32_t pa[4];
      pack_a<T>(pa, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int dn = 0; dn < DV / 8; dn += 2) mma_kn(o[dn], o[dn + 1], pa, vb, DV + kPad, kc * 16, dn * 8, lane);
    }
    __syncthreads();  // this buffer is reloaded two tiles on
  }
  // The warp's own rows of the output into shared memory (over its own Q rows, which only it read),
  // then out as whole rows.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * warp + g + 8 * r;
    const float sum = quad_sum(l[r]);
#pragma unroll
    for (int dn = 0; dn < DV / 8; ++dn)
      *reinterpret_cast<uint32_t*>(qs + row * kOs + dn * 8 + c) =
          Half<T>::pack(o[dn][2 * r] / sum, o[dn][2 * r + 1] / sum);
    if (c == 0 && r0 + g + 8 * r < p.Tlen) p.lse[p.lse_index(b, r0 + g + 8 * r, h)] = (m[r] + log2f(sum)) * kLn2;
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out);
  for (int i = threadIdx.x; i < kQ * (DV / 8); i += kThreads) {
    const int r = i / (DV / 8), col = i % (DV / 8) * 8;
    if (q0 + r < p.Tlen)
      *reinterpret_cast<uint4*>(out + p.out_index(b, q0 + r, h) + col) =
          *reinterpret_cast<const uint4*>(qs + r * kOs + col);
  }
}

// delta[b, h, t] = sum_d dout * out, the softmax backward's row term: one warp per output row.
template <typename T>
__global__ void delta_kernel(float* delta, const T* out, const T* dout, int64_t B, int64_t Tlen, int64_t Hq, int Dv) {
  const int lane = threadIdx.x % 32;
  const int64_t w = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;  // (b * Tlen + t) * Hq + h
  if (w >= B * Tlen * Hq) return;
  float s = 0.0f;
  for (int d = lane; d < Dv; d += 32) s += static_cast<float>(out[w * Dv + d]) * static_cast<float>(dout[w * Dv + d]);
  for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
  const int64_t h = w % Hq, t = w / Hq % Tlen, b = w / Hq / Tlen;
  if (lane == 0) delta[(b * Hq + h) * Tlen + t] = s;
}

// dq of 64 query rows: dq = scale * sum over key tiles of dS K, dS = P (dO V^T - delta). K and V
// tiles double-buffered as in the forward.
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(kThreads) dq_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kKs = kKv * (DQK + kPad), kVs = kKv * (DV + kPad);
  T* qs = reinterpret_cast<T*>(smem);  // [kQ][DQK + kPad]
  T* dos = qs + kQ * (DQK + kPad);      // [kQ][DV + kPad]
  T* ks = dos + kQ * (DV + kPad);       // [2][kKv][DQK + kPad]
  T* vs = ks + 2 * kKs;                 // [2][kKv][DV + kPad]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
  const int64_t b = blockIdx.z, h = blockIdx.y, grp = h / p.group_size();
  const int64_t q0 = (gridDim.x - 1 - blockIdx.x) * int64_t{kQ};
  const int64_t r0 = q0 + 16 * warp;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);
  const int tiles = static_cast<int>((min(q0 + kQ, p.Tlen) + kKv - 1) / kKv);
  const auto load = [&](int tile) {
    const int64_t k0 = int64_t{tile} * kKv;
    stage<T, kKv, DQK>(ks + (tile & 1) * kKs, k,
                       [&](int r) { return k0 + r < p.Tlen ? k + p.kv_index(b, k0 + r, grp) : nullptr; });
    stage<T, kKv, DV>(vs + (tile & 1) * kVs, v,
                      [&](int r) { return k0 + r < p.Tlen ? v + p.kv_index(b, k0 + r, grp) : nullptr; });
    cp_async_commit();
  };
  stage<T, kQ, DQK>(qs, q, [&](int r) { return q0 + r < p.Tlen ? q + p.q_index(b, q0 + r, h) : nullptr; });
  stage<T, kQ, DV>(dos, dout, [&](int r) { return q0 + r < p.Tlen ? dout + p.out_index(b, q0 + r, h) : nullptr; });
  load(0);  // one group with q and dO
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = r0 + g + 8 * r;
    lse2[r] = row < p.Tlen ? p.lse[p.lse_index(b, row, h)] * kLog2e : 0.0f;
    delta[r] = row < p.Tlen ? p.delta[p.lse_index(b, row, h)] : 0.0f;
  }
  float dq[DQK / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load(tile + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* kb = ks + (tile & 1) * kKs;
    const T* vb = vs + (tile & 1) * kVs;
    const int64_t k0 = int64_t{tile} * kKv;
    float s[kKv / 8][4] = {}, dp[kKv / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < DQK / 16; ++kc) {
      uint32_t a[4];
      load_a(a, qs, DQK + kPad, 16 * warp, kc * 16, lane);
#pragma unroll
      for (int nt = 0; nt < kKv / 8; nt += 2) mma_nk(s[nt], s[nt + 1], a, kb, DQK + kPad, nt * 8, kc * 16, lane);
    }
#pragma unroll
    for (int kc = 0; kc < DV / 16; ++kc) {
      uint32_t a[4];
      load_a(a, dos, DV + kPad, 16 * warp, kc * 16, lane);
#pragma unroll
      for (int nt = 0; nt < kKv / 8; nt += 2) mma_nk(dp[nt], dp[nt + 1], a, vb, DV + kPad, nt * 8, kc * 16, lane);
    }
    // Masked (S = -inf, P = 0) only where the tile crosses the diagonal or the warp's rows pass Tlen,
    // a branch the whole warp takes alike: key k0 + j is seen by row r0 + i when j <= r0 - k0 + i.
    if (k0 + kKv > r0 + 1 || r0 + 16 > p.Tlen) {
      const int64_t seen = r0 + g - k0, rows_left = p.Tlen - r0 - g;
#pragma unroll
      for (int nt = 0; nt < kKv / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = i >> 1, j = nt * 8 + c + (i & 1);
          if (j > seen + 8 * r || 8 * r >= rows_left) s[nt][i] = -INFINITY;
        }
    }
#pragma unroll
    for (int nt = 0; nt < kKv / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i >> 1;
        s[nt][i] = fast_exp2(s[nt][i] * p.scale_log2 - lse2[r]) * (dp[nt][i] - delta[r]);  // dS = P (dP - delta)
      }
#pragma unroll
    for (int kc = 0; kc < kKv / 16; ++kc) {
      uint32_t a[4];
      pack_a<T>(a, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int dn = 0; dn < DQK / 8; dn += 2) mma_kn(dq[dn], dq[dn + 1], a, kb, DQK + kPad, kc * 16, dn * 8, lane);
    }
    __syncthreads();
  }
  T* dq_out = static_cast<T*>(p.dq);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = r0 + g + 8 * r;
    if (row >= p.Tlen) continue;
    T* d = dq_out + p.q_index(b, row, h);
#pragma unroll
    for (int dn = 0; dn < DQK / 8; ++dn)
      *reinterpret_cast<uint32_t*>(d + dn * 8 + c) =
          Half<T>::pack(p.scale * dq[dn][2 * r], p.scale * dq[dn][2 * r + 1]);
  }
}

// dk and dv of 64 keys of kv head grp (16 per warp), summed over the group's query heads and the
// query rows at or after each key, KQ rows a step (double-buffered). Works on transposes:
// S^T = K Q^T, dP^T = V dO^T, dv += P^T dO, dk += dS^T Q, so each warp's 16 keys are the rows of
// every product.
template <typename T, int DQK, int DV, int KQ>
__global__ void __launch_bounds__(kThreads) dkv_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kQs = KQ * (DQK + kPad), kDos = KQ * (DV + kPad);
  T* ks = reinterpret_cast<T*>(smem);  // [kKv][DQK + kPad]
  T* vs = ks + kKv * (DQK + kPad);      // [kKv][DV + kPad]
  T* qs = vs + kKv * (DV + kPad);       // [2][KQ][DQK + kPad]
  T* dos = qs + 2 * kQs;                // [2][KQ][DV + kPad]
  float* lse2 = reinterpret_cast<float*>(dos + 2 * kDos);  // [2][KQ]
  float* delta = lse2 + 2 * KQ;                            // [2][KQ]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
  const int64_t b = blockIdx.z, grp = blockIdx.y, k0 = blockIdx.x * int64_t{kKv};
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);
  // Steps: the group's query heads, and for each the tiles of KQ query rows from k0 on.
  const int per_head = static_cast<int>((p.Tlen - k0 + KQ - 1) / KQ);
  const int steps = static_cast<int>(p.group_size()) * per_head;
  const auto load = [&](int step) {
    const int64_t h = grp * p.group_size() + step / per_head, t0 = k0 + int64_t{step % per_head} * KQ;
    const int buf = step & 1;
    stage<T, KQ, DQK>(qs + buf * kQs, q, [&](int r) { return t0 + r < p.Tlen ? q + p.q_index(b, t0 + r, h) : nullptr; });
    stage<T, KQ, DV>(dos + buf * kDos, dout,
                     [&](int r) { return t0 + r < p.Tlen ? dout + p.out_index(b, t0 + r, h) : nullptr; });
    cp_async_commit();
    if (threadIdx.x < KQ) {
      const int64_t row = t0 + threadIdx.x;
      lse2[buf * KQ + threadIdx.x] = row < p.Tlen ? p.lse[p.lse_index(b, row, h)] * kLog2e : 0.0f;
      delta[buf * KQ + threadIdx.x] = row < p.Tlen ? p.delta[p.lse_index(b, row, h)] : 0.0f;
    }
  };
  stage<T, kKv, DQK>(ks, k, [&](int r) { return k0 + r < p.Tlen ? k + p.kv_index(b, k0 + r, grp) : nullptr; });
  stage<T, kKv, DV>(vs, v, [&](int r) { return k0 + r < p.Tlen ? v + p.kv_index(b, k0 + r, grp) : nullptr; });
  load(0);  // one group with K and V
  float dk[DQK / 8][4] = {}, dv[DV / 8][4] = {};
  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) {
      load(step + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int buf = step & 1;
    const T* qb = qs + buf * kQs;
    const T* dob = dos + buf * kDos;
    const int64_t t0 = k0 + int64_t{step % per_head} * KQ;
    float st[KQ / 8][4] = {}, dpt[KQ / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < DQK / 16; ++kc) {
      uint32_t a[4];
      load_a(a, ks, DQK + kPad, 16 * warp, kc * 16, lane);
#pragma unroll
      for (int nt = 0; nt < KQ / 8; nt += 2) mma_nk(st[nt], st[nt + 1], a, qb, DQK + kPad, nt * 8, kc * 16, lane);
    }
#pragma unroll
    for (int kc = 0; kc < DV / 16; ++kc) {
      uint32_t a[4];
      load_a(a, vs, DV + kPad, 16 * warp, kc * 16, lane);
#pragma unroll
      for (int nt = 0; nt < KQ / 8; nt += 2) mma_nk(dpt[nt], dpt[nt + 1], a, dob, DV + kPad, nt * 8, kc * 16, lane);
    }
    // Masked (S = -inf, P = 0) only where the step's rows reach back to the warp's keys or pass Tlen,
    // a branch the whole warp takes alike: row t0 + j sees key k0 + 16 w + i when j >= k0 + 16 w + i - t0.
    if (k0 + 16 * warp + 15 > t0 || t0 + KQ > p.Tlen) {
      const int64_t first_key = k0 + 16 * warp + g - t0, rows_left = p.Tlen - t0;
#pragma unroll
      for (int nt = 0; nt < KQ / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = nt * 8 + c + (i & 1);
          if (j < first_key + (i >> 1) * 8 || j >= rows_left) st[nt][i] = -INFINITY;
        }
    }
#pragma unroll
    for (int nt = 0; nt < KQ / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nt * 8 + c + (i & 1);
        const float prob = fast_exp2(st[nt][i] * p.scale_log2 - lse2[buf * KQ + col]);
        st[nt][i] = prob;
        dpt[nt][i] = prob * (dpt[nt][i] - delta[buf * KQ + col]);  // dS^T
      }
#pragma unroll
    for (int kc = 0; kc < KQ / 16; ++kc) {
      uint32_t pa[4], da[4];
      pack_a<T>(pa, st[2 * kc], st[2 * kc + 1]);
      pack_a<T>(da, dpt[2 * kc], dpt[2 * kc + 1]);
#pragma unroll
      for (int dn = 0; dn < DV / 8; dn += 2) mma_kn(dv[dn], dv[dn + 1], pa, dob, DV + kPad, kc * 16, dn * 8, lane);
#pragma unroll
      for (int dn = 0; dn < DQK / 8; dn += 2) mma_kn(dk[dn], dk[dn + 1], da, qb, DQK + kPad, kc * 16, dn * 8, lane);
    }
    __syncthreads();
  }
  T* dk_out = static_cast<T*>(p.dk);
  T* dv_out = static_cast<T*>(p.dv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = k0 + 16 * warp + g + 8 * r;
    if (key >= p.Tlen) continue;
    T* dkr = dk_out + p.kv_index(b, key, grp);
    T* dvr = dv_out + p.kv_index(b, key, grp);
#pragma unroll
    for (int dn = 0; dn < DQK / 8; ++dn)
      *reinterpret_cast<uint32_t*>(dkr + dn * 8 + c) =
          Half<T>::pack(p.scale * dk[dn][2 * r], p.scale * dk[dn][2 * r + 1]);
#pragma unroll
    for (int dn = 0; dn < DV / 8; ++dn)
      *reinterpret_cast<uint32_t*>(dvr + dn * 8 + c) = Half<T>::pack(dv[dn][2 * r], dv[dn][2 * r + 1]);
  }
}

template <int V>
using Int = std::integral_constant<int, V>;

// Calls f(T{}, Int<DQK>{}, Int<DV>{}) for the tensors' dtype and the instantiated head sizes
// (flash_attention_unsupported() has already refused the rest).
template <typename F>
void dispatch(DType dtype, HeadDim D, F&& f) {
  const auto dims = [&](auto t) {
    if (D.qk == 32) return f(t, Int<32>{}, Int<32>{});
    if (D.qk == 64) return f(t, Int<64>{}, Int<64>{});
    if (D.qk == 128) return f(t, Int<128>{}, Int<128>{});
    if (D.v == 128) return f(t, Int<192>{}, Int<128>{});
    return f(t, Int<192>{}, Int<192>{});
  };
  if (dtype == DType::BF16) return dims(__nv_bfloat16{});
  return dims(__half{});
}

// Launches `kernel` with `smem` bytes of dynamic shared memory (opted into past the default 48 KiB).
template <typename Kernel>
void launch(const ExecContext& ctx, Kernel kernel, dim3 grid, size_t smem, const Params& p) {
  MEGATON_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kThreads, smem, detail::stream_of(ctx)>>>(p);
  MEGATON_CUDA_LAUNCH_CHECK();
}

void* at(const TensorAt& x) { return static_cast<char*>(x.t.raw()) + x.offset * dtype_size(x.t.dtype()); }

Params make_params(TensorAt q, TensorAt k, TensorAt v, int64_t Tlen, int64_t Tk, int64_t Hq, int64_t Hkv, HeadDim D,
                   HeadStrides q_at, HeadStrides kv_at, double scale, int64_t pos_offset, int64_t kv_batch) {
  Params p{};
  p.q = at(q);
  p.k = at(k);
  p.v = at(v);
  p.Tlen = Tlen;
  p.Tk = Tk;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.q_at = q_at;
  p.kv_at = kv_at;
  p.kv_batch = kv_batch;
  p.pos_offset = pos_offset;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.dqk = static_cast<int>(D.qk);
  p.dv_dim = static_cast<int>(D.v);
  return p;
}

}  // namespace

void flash_attention_forward(const ExecContext& ctx, const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k,
                             TensorAt v, int64_t B, int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D,
                             HeadStrides q_at, HeadStrides kv_at, double scale, int64_t pos_offset,
                             int64_t kv_batch_stride) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (B == 0 || Tlen == 0) return;
  const int64_t Tk = pos_offset + Tlen;
  const FlashAttentionPlan plan = flash_attention_plan(D, Tlen, Tk);
  Params p = make_params(q, k, v, Tlen, Tk, Hq, Hkv, D, q_at, kv_at, scale, pos_offset, kv_batch_stride);
  p.out = out.raw();
  p.lse = static_cast<float*>(lse.raw());
  const dim3 grid(detail::grid_blocks(plan.q_blocks, "attention_forward"), static_cast<unsigned>(Hq),
                  static_cast<unsigned>(B));
  dispatch(q.t.dtype(), D, [&]<typename T, int DQK, int DV>(T, Int<DQK>, Int<DV>) {
    launch(ctx, forward_kernel<T, DQK, DV>, grid, plan.forward_smem, p);
  });
}

void flash_attention_backward(const ExecContext& ctx, TensorAt dq, TensorAt dk, TensorAt dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, TensorAt q, TensorAt k, TensorAt v, int64_t B,
                              int64_t Tlen, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at,
                              double scale) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (B == 0 || Tlen == 0) return;
  const FlashAttentionPlan plan = flash_attention_plan(D, Tlen, Tlen);
  Tensor delta = Tensor::empty({B * Hq, Tlen}, DType::F32, MemCategory::Workspace, "attention_delta", ctx.device);
  Params p = make_params(q, k, v, Tlen, Tlen, Hq, Hkv, D, q_at, kv_at, scale, 0, Tlen * kv_at.row);
  p.dout = dout.raw();
  p.dq = at(dq);
  p.dk = at(dk);
  p.dv = at(dv);
  p.lse = static_cast<float*>(lse.raw());
  p.delta = static_cast<const float*>(delta.raw());
  const dim3 q_grid(detail::grid_blocks(plan.q_blocks, "attention_backward"), static_cast<unsigned>(Hq),
                    static_cast<unsigned>(B));
  const dim3 kv_grid(detail::grid_blocks(plan.kv_blocks, "attention_backward"), static_cast<unsigned>(Hkv),
                     static_cast<unsigned>(B));
  const int64_t rows = B * Tlen * Hq;
  dispatch(q.t.dtype(), D, [&]<typename T, int DQK, int DV>(T, Int<DQK>, Int<DV>) {
    delta_kernel<<<detail::grid_blocks((rows + kWarps - 1) / kWarps, "attention_backward"), kThreads, 0,
                   detail::stream_of(ctx)>>>(static_cast<float*>(delta.raw()), static_cast<const T*>(out.raw()),
                                             static_cast<const T*>(dout.raw()), B, Tlen, Hq, DV);
    MEGATON_CUDA_LAUNCH_CHECK();
    launch(ctx, dq_kernel<T, DQK, DV>, q_grid, plan.dq_smem, p);
    launch(ctx, dkv_kernel<T, DQK, DV, flash_kv_q_tile(DQK, DV)>, kv_grid, plan.dkv_smem, p);
  });
}

}  // namespace megaton::kernels::cuda
