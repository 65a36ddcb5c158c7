// Megatron-Core's tensor- and sequence-parallel mappings (tensor_parallel/mappings.py) as plain
// functions: with explicit forward / backward there is no autograd function to wrap, so a module
// calls the forward op of a region in its forward and the matching op in its backward:
//   copy to the tensor-parallel region      forward identity            backward reduce_from_region
//   reduce from the tensor-parallel region  forward reduce_from_region  backward identity
//   gather from the sequence-parallel region   forward gather_rows          backward reduce_scatter_rows
//   reduce-scatter to the sequence-parallel region forward reduce_scatter_rows backward gather_rows
//   scatter to the sequence-parallel region   forward scatter_rows         backward gather_rows
// Activations are [rows, columns] with rows the micro-batch's tokens (b, t); sequence parallelism
// splits the rows evenly over the group, rank r holding block r. Norms and residuals are per row,
// so any even split of the token rows is a valid sequence split; attention runs on the gathered rows.
#pragma once
#include "megaton/parallel/communicator.h"

namespace megaton::parallel {

// In place: t = the sum (or max, ...) of t over the group.
void reduce_from_region(Communicator& group, const Tensor& t, ReduceOp op = ReduceOp::Sum);
// [rows / size, C] on each rank -> [rows, C], block r from rank r.
Tensor gather_rows(Communicator& group, const Tensor& t, const std::string& name);
// [rows, C] on each rank -> [rows / size, C]: block `rank` of the sum over the group.
Tensor reduce_scatter_rows(Communicator& group, const Tensor& t, const std::string& name);
// [rows, C] -> a copy of block `rank`, [rows / size, C] (no communication).
Tensor scatter_rows(Communicator& group, const Tensor& t, const std::string& name);

// Waits for an operation started asynchronously (an expert-parallel all-to-all), counting the time
// blocked with the collectives above; returns those seconds.
double wait_counted(Work& work);

// Seconds this thread has spent blocked in the collectives above since it started (they are
// blocking: compute waits for them), for the step's comm_wait_s.
double tensor_parallel_wait_seconds();

}  // namespace megaton::parallel
