#include "megaton/parallel/communicator.h"

namespace megaton::parallel {

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  Tensor t = Tensor::empty({1}, DType::F64, MemCategory::Other, name() + ".scalar");
  *t.data<double>() = v;
  all_reduce(t, op);
  return *t.data<double>();
}

}  // namespace megaton::parallel
