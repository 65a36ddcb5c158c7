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

// Seconds from posting to arrival of `repeats` sends of `bytes` from rank 0 to rank 1, which waits
// for each, while rank 0 computes for `busy_s` right after posting (as a pipeline stage goes on to
// its next op); the same on every rank. Post and arrival are read off the steady clock in two
// processes, so the two ranks must share a node (the clock is the node's). Needs 2 ranks or more.
std::vector<double> busy_send_seconds(parallel::Communicator& comm, double bytes, double busy_s, int repeats);

// LinkSpec::busy_send_delay_s from those timings: their mean (a step pays every boundary's delay,
// and on 2 oversubscribed cores they are bimodal, 0.5 or 2-7 ms) less what `link` already charges a
// message of `bytes`, at least 0.
double busy_send_delay(std::span<const double> seconds, const LinkSpec& link, double bytes);

}  // namespace megaton::plan
