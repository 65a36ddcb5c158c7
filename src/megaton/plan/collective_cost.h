// Cost of one collective on a link (the alpha-beta model of ring algorithms, NCCL's and Open MPI's
// for large messages): `bytes` is the whole tensor (all-reduce: the reduced tensor; all-gather /
// reduce-scatter: the gathered one; all-to-all: what one rank sends in all; send / recv: the
// message). A ring all-reduce is a reduce-scatter then an all-gather: 2(n-1) steps, each moving
// 1/n of the tensor; all-gather and reduce-scatter n-1 steps; all-to-all n-1 pairwise exchanges of
// 1/n each. `plan calibrate` fits the link's latency, bandwidth and per-collective efficiency to
// measured timings with these same formulas.
#pragma once
#include "megaton/plan/system.h"

namespace megaton::plan {

inline double collective_time(Collective c, const LinkSpec& link, int64_t ranks, double bytes) {
  if (ranks <= 1 && c != Collective::SendRecv) return 0.0;
  const double n = static_cast<double>(ranks);
  const double bw = link.bandwidth_Bps * link.efficiency.at(c);
  switch (c) {
    case Collective::AllReduce: return 2.0 * (n - 1) * link.latency_s + 2.0 * (n - 1) / n * bytes / bw;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll: return (n - 1) * link.latency_s + (n - 1) / n * bytes / bw;
    case Collective::SendRecv: return link.latency_s + bytes / bw;
  }
  return 0.0;
}

}  // namespace megaton::plan
