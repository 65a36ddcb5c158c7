// The counting conventions of the planner: FLOPs of the compute-bound ops and bytes moved by the
// memory-bound ones. `megaton plan calibrate` turns measured times into efficiencies with these same
// functions and the cost model turns efficiencies back into times with them, so a convention that
// over- or under-counts cancels out between the two.
#pragma once
#include <cstdint>

namespace megaton::plan {

// C[m, n] = A[m, k] B[k, n].
inline double gemm_flops(double m, double n, double k) { return 2.0 * m * n * k; }

// Causal attention of one (sequence, head) pair, FlashAttention-style: the forward's two matmuls
// over the s^2 / 2 unmasked scores (QK^T with qk_dim, PV with v_dim); the backward recomputes the
// scores and runs four matmuls (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q).
inline double attention_flops(double seq, double qk_dim, double v_dim, bool backward) {
  const double pairs = seq * seq / 2.0;
  return backward ? 2.0 * pairs * (3.0 * qk_dim + 2.0 * v_dim) : 2.0 * pairs * (qk_dim + v_dim);
}

// Bytes of the memory-bound ops over `rows` x `cols` elements of `elem` bytes each (the tensors read
// and written once; per-row statistics and weights not counted).
// LayerNorm / RMSNorm: forward reads x, writes y; backward reads x and dy, writes dx.
inline double norm_bytes(double rows, double cols, double elem, bool backward) {
  return (backward ? 3.0 : 2.0) * rows * cols * elem;
}
// GeLU over `cols` (reads h, writes a; backward reads h and da, writes dh) or SwiGLU over
// `cols` outputs (reads [gate | up], writes a; backward reads [gate | up] and da, writes both grads).
inline double activation_bytes(double rows, double cols, double elem, bool gated, bool backward) {
  if (gated) return (backward ? 5.0 : 3.0) * rows * cols * elem;
  return (backward ? 3.0 : 2.0) * rows * cols * elem;
}
// An elementwise binary op (residual add, bias add): two reads, one write.
inline double elementwise_bytes(double n, double elem) { return 3.0 * n * elem; }
// Embedding lookup of `rows` ids (reads the table rows, writes the output); backward reads dy and
// adds into the fp32 gradient rows (read + write).
inline double embedding_bytes(double rows, double cols, double elem, bool backward) {
  return backward ? rows * cols * (elem + 8.0) : 2.0 * rows * cols * elem;
}
// Softmax cross-entropy over `rows` x `vocab` logits: forward reads them twice (max, then sum-exp
// and target); backward reads them and writes the gradient.
inline double cross_entropy_bytes(double rows, double vocab, double elem, bool backward) {
  return 2.0 * rows * vocab * elem;
}
// RoPE over `rows` x `cols` values of q and k: read and write (either direction).
inline double rope_bytes(double rows, double cols, double elem) { return 2.0 * rows * cols * elem; }
// One AdamW update per parameter: reads weight, grad and both moments (fp32), writes weight and
// moments, and writes the `compute_elem`-byte compute copy (0: none).
inline double optimizer_bytes(double params, double compute_elem) { return params * (28.0 + compute_elem); }

}  // namespace megaton::plan
