// The network half of `megaton plan calibrate`: timings of the communicator's collectives over a
// range of message sizes, and the fit of the cost model of plan/collective_cost.h (latency per
// step, bandwidth, an efficiency per collective) to them. The fit is a pure function of the
// timings, so it is tested on synthetic ones without MPI.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "megaton/parallel/communicator.h"
#include "megaton/plan/system.h"

namespace megaton::plan {

// One timed collective: `bytes` as collective_time counts them (the whole tensor: the reduced one,
// the gathered one, what one rank sends in all, or the message), seconds per call.
struct CollectiveSample {
  Collective collective;
  double bytes = 0;
  double seconds = 0;
};

// collective_time (plan/collective_cost.h) for a group of `ranks` is linear in the link's figures:
//   latency_steps * latency_s + byte_factor * bytes / (bandwidth_Bps * efficiency).
// The two coefficients, read off that formula itself so the fit can never drift from the model.
struct CollectiveTerms {
  double latency_steps = 0;
  double byte_factor = 0;
};
CollectiveTerms collective_terms(Collective c, int64_t ranks);

// Message sizes below this bound the latency; sizes from kLargeMessageBytes up the bandwidth terms.
inline constexpr double kSmallMessageBytes = 64 * 1024;
inline constexpr double kLargeMessageBytes = 1024 * 1024;

// Fits a link to the samples of a group of `ranks` (>= 2), weighing each sample by 1 / seconds^2
// (relative errors: timings are noisy in proportion to their length): each collective's byte term
// is fitted on its large messages, the shared latency on the small messages of all of them (the two
// solved together, in closed form). bandwidth_Bps is the fastest fitted per-byte rate, normally
// send_recv's, so every efficiency is that collective's rate over it, in (0, 1]. Every collective
// needs a large sample and some collective a small one; a byte term that does not grow with the
// size is an error naming the collective.
LinkSpec fit_link(std::span<const CollectiveSample> samples, int64_t ranks);

// Times every collective of `comm` at each size (bytes; rounded down to whole f32 blocks of the
// group), on every rank together. A sample is the best of a few batches of back-to-back calls, each
// batch's time the slowest rank's, so every rank returns the same samples. send_recv pairs rank r
// with r ^ 1 (a rank without a partner idles) and times a ping-pong: one message is half a round
// trip. Each sample takes about `target_s` (at least its first call and a batch of one call each).
std::vector<CollectiveSample> time_collectives(parallel::Communicator& comm, const std::vector<double>& sizes,
                                               double target_s);

}  // namespace megaton::plan
