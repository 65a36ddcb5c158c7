// MpiCommunicator under mpirun (registered for 2 and 4 ranks): every operation against values each
// rank computes itself from the rank-dependent inputs of all ranks. Every rank runs every test and
// issues the same operations in the same order; checks are EXPECTs so that a failing rank keeps
// issuing them too (a diverging rank would deadlock the others until the CTest timeout).
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "../support/mpi_test_main.h"
#include "../support/temp_dir.h"
#include "megaton/parallel/mpi_communicator.h"
#include "megaton/parallel/process_groups.h"

namespace megaton::parallel {
using megaton::testing::error_message;

namespace {

Communicator& W() { return world(); }

// Small integers (|v| < 64) so that every dtype, bf16 included, holds them and their sums over 4
// ranks exactly.
double value(int rank, int64_t i) { return static_cast<double>((i * 7 + rank * 5) % 23 - 11 + rank); }

Tensor filled(DType dt, int64_t n, const std::function<double(int64_t)>& f, const std::string& name) {
  Tensor t = Tensor::empty({n}, dt, MemCategory::Other, name);
  Tensor f64 = Tensor::empty({n}, DType::F64, MemCategory::Other, name + ".f64");
  for (int64_t i = 0; i < n; ++i) f64.data<double>()[i] = f(i);
  t.copy_from(f64);
  return t;
}

std::vector<double> values_of(const Tensor& t) {
  Tensor f64 = t.to(DType::F64);
  return {f64.data<double>(), f64.data<double>() + f64.numel()};
}

// Exact comparison (the inputs are small integers); NaN is a failure.
void expect_values(const Tensor& t, const std::function<double(int64_t)>& want, const std::string& what) {
  const auto got = values_of(t);
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double w = want(static_cast<int64_t>(i));
    if (!(std::isfinite(got[i]) && got[i] == w)) {
      ADD_FAILURE() << what << " [" << dtype_name(t.dtype()) << "] element " << i << ": got " << got[i] << ", want "
                    << w << " (rank " << W().rank() << " of " << W().size() << ")";
      ++bad;
    }
  }
}

double reduce_expected(ReduceOp op, int n, const std::function<double(int)>& per_rank) {
  double acc = per_rank(0);
  for (int r = 1; r < n; ++r) {
    const double v = per_rank(r);
    acc = op == ReduceOp::Sum ? acc + v : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Max ? "max" : "min"; }

TEST(MpiCommunicator, WorldIsMpiWithTheLaunchersSize) {
  ASSERT_NE(dynamic_cast<MpiCommunicator*>(&W()), nullptr);
  EXPECT_EQ(W().name(), "world");
  EXPECT_EQ(W().size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(W().rank(), launched_rank());
  EXPECT_EQ(&world(), &W());
  W().barrier();
}

TEST(MpiCommunicator, AllReduceEveryDtypeAndOp) {
  const int n = W().size(), me = W().rank();
  for (DType dt : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      const int64_t len = 37;
      Tensor t = filled(
          dt, len, [&](int64_t i) { return value(me, i); }, "x");
      W().all_reduce(t, op);
      expect_values(
          t, [&](int64_t i) { return reduce_expected(op, n, [&](int r) { return value(r, i); }); },
          std::string("all_reduce ") + op_name(op));
    }
  }
  // Large enough for the rendezvous protocol (past every eager limit), with fractions in f32.
  const int64_t big = 300000;
  Tensor t = filled(
      DType::F32, big, [&](int64_t i) { return 0.25 * value(me, i); }, "big");
  W().all_reduce(t);
  expect_values(
      t, [&](int64_t i) { return reduce_expected(ReduceOp::Sum, n, [&](int r) { return 0.25 * value(r, i); }); },
      "all_reduce big");
  EXPECT_EQ(W().all_reduce_scalar(me + 1.5), n * (n + 1) / 2.0 + 0.5 * n);
  EXPECT_EQ(W().all_reduce_scalar(me, ReduceOp::Max), n - 1);
}

TEST(MpiCommunicator, Bf16SumsInF32) {
  // Values whose sums over the group are bf16 values: the user-defined op adds pairs in f32 and
  // rounds each partial sum back to bf16.
  const int n = W().size();
  Tensor t = filled(
      DType::BF16, 4, [&](int64_t i) { return i == 0   ? 1.0
                                              : i == 1 ? 0.5
                                              : i == 2 ? -2.0
                                                       : 96.0; }, "b");
  W().all_reduce(t);
  expect_values(
      t,
      [&](int64_t i) {
        return n * (i == 0 ? 1.0 : i == 1 ? 0.5 : i == 2 ? -2.0 : 96.0);
      },
      "bf16 sum");
  // NaN on one rank survives max.
  Tensor m = filled(
      DType::BF16, 2, [&](int64_t i) { return W().rank() == 1 && i == 0 ? NAN : 3.0; }, "m");
  W().all_reduce(m, ReduceOp::Max);
  const auto got = values_of(m);
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], 3.0);
}

TEST(MpiCommunicator, ReduceScatter) {
  const int n = W().size(), me = W().rank();
  const int64_t block = 5;
  for (const auto& [dt, bound_op] : {std::pair{DType::F32, ReduceOp::Sum}, std::pair{DType::BF16, ReduceOp::Sum},
                                    std::pair{DType::I64, ReduceOp::Max}, std::pair{DType::F64, ReduceOp::Min}}) {
    const ReduceOp op = bound_op;  // a variable the lambdas below can capture (clang 14 cannot capture a binding)
    Tensor in = filled(
        dt, block * n, [&](int64_t i) { return value(me, i); }, "in");
    Tensor out = Tensor::zeros({block}, dt, MemCategory::Other, "out");
    W().reduce_scatter(out, in, op);
    expect_values(
        out, [&](int64_t j) { return reduce_expected(op, n, [&](int r) { return value(r, me * block + j); }); },
        std::string("reduce_scatter ") + op_name(op));
  }
  // The output a window of the input (a shard of a flat gradient buffer): staged, same result.
  Tensor buf = filled(
      DType::F32, block * n, [&](int64_t i) { return value(me, i); }, "flat");
  Tensor shard = buf.window(me * block, {block}, "flat.shard");
  W().reduce_scatter(shard, buf);
  expect_values(
      shard,
      [&](int64_t j) { return reduce_expected(ReduceOp::Sum, n, [&](int r) { return value(r, me * block + j); }); },
      "reduce_scatter into its own input");
}

TEST(MpiCommunicator, AllGatherAnyDtype) {
  const int n = W().size(), me = W().rank();
  const int64_t block = 3;
  for (DType dt : {DType::U8, DType::I8, DType::F16, DType::BF16, DType::F32, DType::F64, DType::I64}) {
    auto mine = [&](int r, int64_t j) { return static_cast<double>(r * 10 + j + 1); };
    Tensor in = filled(
        dt, block, [&](int64_t j) { return mine(me, j); }, "in");
    Tensor out = Tensor::zeros({n * block}, dt, MemCategory::Other, "out");
    W().all_gather(out, in);
    expect_values(
        out, [&](int64_t i) { return mine(static_cast<int>(i / block), i % block); }, "all_gather");
  }
  // In place: the input is this rank's block of the output.
  Tensor out = Tensor::zeros({n * block}, DType::F32, MemCategory::Other, "gathered");
  Tensor in = out.window(me * block, {block}, "gathered.mine");
  for (int64_t j = 0; j < block; ++j) in.data<float>()[j] = static_cast<float>(me * 100 + j);
  W().all_gather(out, in);
  expect_values(
      out, [&](int64_t i) { return static_cast<double>((i / block) * 100 + i % block); }, "all_gather in place");
}

// Rank r sends count(r, p) elements to peer p, each encoding (r, p, j).
int64_t a2a_count(int r, int p) { return (r + 2 * p) % 3; }
double a2a_value(int r, int p, int64_t j) { return r * 1000 + p * 100 + j; }

TEST(MpiCommunicator, UnevenAllToAllWithZeroCounts) {
  const int n = W().size(), me = W().rank();
  for (DType dt : {DType::I32, DType::F64, DType::BF16}) {
    std::vector<int64_t> in_counts(n), out_counts(n);
    std::vector<double> send;
    for (int p = 0; p < n; ++p) {
      in_counts[p] = a2a_count(me, p);
      out_counts[p] = a2a_count(p, me);
      for (int64_t j = 0; j < in_counts[p]; ++j) send.push_back(dt == DType::BF16 ? p * 4 + j : a2a_value(me, p, j));
    }
    std::vector<double> want;
    for (int p = 0; p < n; ++p)
      for (int64_t j = 0; j < out_counts[p]; ++j) want.push_back(dt == DType::BF16 ? me * 4 + j : a2a_value(p, me, j));
    Tensor in = filled(
        dt, static_cast<int64_t>(send.size()), [&](int64_t i) { return send[i]; }, "tokens");
    Tensor out = Tensor::zeros({static_cast<int64_t>(want.size())}, dt, MemCategory::Other, "received");
    W().all_to_all(out, out_counts, in, in_counts);
    expect_values(
        out, [&](int64_t i) { return want[i]; }, "all_to_all");
  }
  // Rank 0 sends and receives nothing at all (empty tensors); the others exchange one element each.
  std::vector<int64_t> counts(n, me == 0 ? 0 : 1);
  counts[0] = 0;
  const int64_t k = me == 0 ? 0 : n - 1;
  Tensor in = filled(
      DType::I64, k, [&](int64_t) { return me; }, "in");
  Tensor out = Tensor::zeros({k}, DType::I64, MemCategory::Other, "out");
  W().all_to_all(out, counts, in, counts);
  expect_values(
      out, [&](int64_t i) { return static_cast<double>(i + 1); }, "all_to_all with an idle rank");
}

TEST(MpiCommunicator, BroadcastFromNonZeroRoot) {
  const int n = W().size(), me = W().rank();
  for (int root : {n - 1, 1}) {
    for (DType dt : {DType::BF16, DType::I64, DType::F32}) {
      Tensor t = filled(
          dt, 9, [&](int64_t i) { return value(me, i); }, "weights");
      W().broadcast(t, root);
      expect_values(
          t, [&](int64_t i) { return value(root, i); }, "broadcast");
    }
  }
}

TEST(MpiCommunicator, SendRecvRing) {
  const int n = W().size(), me = W().rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Large (rendezvous) messages, every rank sending first: posted, not blocking, so no deadlock.
  const int64_t len = 1 << 17;
  Tensor out = filled(
      DType::F32, len, [&](int64_t i) { return value(me, i % 97); }, "activations");
  Tensor in = Tensor::zeros({len}, DType::F32, MemCategory::Other, "from_prev");
  auto s = W().send_async(out, next, 7);
  auto r = W().recv_async(in, prev, 7);
  r->wait();
  s->wait();
  expect_values(
      in, [&](int64_t i) { return value(prev, i % 97); }, "ring recv");
  // Two tags received in the opposite order to their sending.
  Tensor a = filled(
      DType::I32, 4, [&](int64_t i) { return me * 10 + i; }, "a");
  Tensor b = filled(
      DType::I32, 4, [&](int64_t i) { return me * 10 + i + 100; }, "b");
  Tensor ra = Tensor::zeros({4}, DType::I32, MemCategory::Other, "ra");
  Tensor rb = Tensor::zeros({4}, DType::I32, MemCategory::Other, "rb");
  auto w1 = W().send_async(a, next, 1);
  auto w2 = W().send_async(b, next, 2);
  W().recv(rb, prev, 2);
  W().recv(ra, prev, 1);
  w1->wait();
  w2->wait();
  expect_values(
      ra, [&](int64_t i) { return prev * 10 + i; }, "recv tag 1");
  expect_values(
      rb, [&](int64_t i) { return prev * 10 + i + 100; }, "recv tag 2");
}

TEST(MpiCommunicator, LargeTensorsInPieces) {
  const int n = W().size(), me = W().rank();
  set_mpi_max_count_for_tests(7);
  Tensor t = filled(
      DType::F64, 50, [&](int64_t i) { return value(me, i); }, "t");
  W().all_reduce(t);
  expect_values(
      t, [&](int64_t i) { return reduce_expected(ReduceOp::Sum, n, [&](int r) { return value(r, i); }); },
      "all_reduce in pieces");
  Tensor b = filled(
      DType::I32, 23, [&](int64_t i) { return value(me, i); }, "b");
  W().broadcast(b, n - 1);
  expect_values(
      b, [&](int64_t i) { return value(n - 1, i); }, "broadcast in pieces");
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Tensor s = filled(
      DType::F32, 30, [&](int64_t i) { return value(me, i); }, "s");
  Tensor r = Tensor::zeros({30}, DType::F32, MemCategory::Other, "r");
  auto ws = W().send_async(s, next, 3);
  W().recv(r, prev, 3);
  ws->wait();
  expect_values(
      r, [&](int64_t i) { return value(prev, i); }, "recv in pieces");
  // Blocks above the limit are refused, naming the operation.
  Tensor in = Tensor::zeros({8 * n}, DType::F32, MemCategory::Other, "in");
  Tensor out = Tensor::zeros({8}, DType::F32, MemCategory::Other, "out");
  const std::string e = error_message([&] { W().reduce_scatter(out, in); });
  EXPECT_NE(e.find("reduce_scatter"), std::string::npos) << e;
  EXPECT_NE(e.find("exceeds"), std::string::npos) << e;
  std::vector<int64_t> counts(n, 8);
  Tensor a = Tensor::zeros({8 * n}, DType::F32, MemCategory::Other, "a");
  EXPECT_NE(error_message([&] { W().all_to_all(a, counts, a, counts); }).find("exceeds"), std::string::npos);
  set_mpi_max_count_for_tests(INT_MAX);
}

TEST(MpiCommunicator, SplitIntoTwoGroupsOfTwo) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int me = W().rank();
  // {0, 1} and {2, 3}, ordered by descending world rank (key).
  auto half = W().split(me / 2, -me, "half");
  EXPECT_EQ(half->name(), "half");
  EXPECT_EQ(half->size(), 2);
  EXPECT_EQ(half->rank(), 1 - me % 2);
  EXPECT_EQ(half->all_reduce_scalar(me), me < 2 ? 1.0 : 5.0);
  Tensor g = Tensor::zeros({2}, DType::I32, MemCategory::Other, "g");
  Tensor mine = filled(
      DType::I32, 1, [&](int64_t) { return me; }, "mine");
  half->all_gather(g, mine);
  expect_values(
      g, [&](int64_t i) { return me < 2 ? 1.0 - i : 3.0 - i; }, "all_gather in the half");
  // A group made of the other halves' members, used between them: {0, 2} and {1, 3}.
  auto parity = W().split(me % 2, me, "parity");
  EXPECT_EQ(parity->all_reduce_scalar(me), me % 2 == 0 ? 2.0 : 4.0);
  half->barrier();
  parity->barrier();
}

TEST(MpiCommunicator, SplitWithAnySize) {
  const int n = W().size(), me = W().rank();
  auto g = W().split(me % 2, me, "parity");
  const int members = (n - me % 2 + 1) / 2;
  EXPECT_EQ(g->size(), members);
  EXPECT_EQ(g->rank(), me / 2);
  double want = 0;
  for (int r = me % 2; r < n; r += 2) want += r;
  EXPECT_EQ(g->all_reduce_scalar(me), want);
  EXPECT_NE(error_message([&] { W().split(-1, 0, "bad"); }).find("color -1"), std::string::npos);
}

TEST(MpiCommunicator, AsyncOpsWaitedInReverseOrder) {
  const int n = W().size(), me = W().rank();
  Tensor a = filled(
      DType::F32, 11, [&](int64_t i) { return value(me, i); }, "a");
  Tensor gin = filled(
      DType::I64, 2, [&](int64_t j) { return me * 2 + j; }, "gin");
  Tensor gout = Tensor::zeros({2 * n}, DType::I64, MemCategory::Other, "gout");
  Tensor b = filled(
      DType::F64, 5, [&](int64_t i) { return value(me, i); }, "b");
  Tensor rin = filled(
      DType::I32, 3 * n, [&](int64_t i) { return value(me, i); }, "rin");
  Tensor rout = Tensor::zeros({3}, DType::I32, MemCategory::Other, "rout");
  Tensor m = filled(
      DType::BF16, 4, [&](int64_t i) { return value(me, i); }, "m");
  std::vector<WorkHandle> work;
  work.push_back(W().all_reduce_async(a, ReduceOp::Sum));
  work.push_back(W().all_gather_async(gout, gin));
  work.push_back(W().broadcast_async(b, n - 1));
  work.push_back(W().reduce_scatter_async(rout, rin, ReduceOp::Sum));
  work.push_back(W().all_reduce_async(m, ReduceOp::Min));
  for (auto it = work.rbegin(); it != work.rend(); ++it) (*it)->wait();
  for (auto& w : work) w->wait();  // waiting twice is allowed
  expect_values(
      a, [&](int64_t i) { return reduce_expected(ReduceOp::Sum, n, [&](int r) { return value(r, i); }); }, "a");
  expect_values(
      gout, [&](int64_t i) { return static_cast<double>(i); }, "gout");
  expect_values(
      b, [&](int64_t i) { return value(n - 1, i); }, "b");
  expect_values(
      rout, [&](int64_t j) { return reduce_expected(ReduceOp::Sum, n, [&](int r) { return value(r, me * 3 + j); }); },
      "rout");
  expect_values(
      m, [&](int64_t i) { return reduce_expected(ReduceOp::Min, n, [&](int r) { return value(r, i); }); }, "m");
}

// Proof of overlap: ranks 1.. issue an all-reduce and then compute for a second before waiting;
// rank 0 waits for the same all-reduce at once. Rank 0 gets its result long before the others
// wait only if their progress threads ran the all-reduce during the computation.
TEST(MpiCommunicator, AsyncAllReduceOverlapsComputation) {
  const int n = W().size(), me = W().rank();
  W().barrier();
  Tensor t = filled(
      DType::F32, 1000, [&](int64_t i) { return value(me, i); }, "grads");
  double waited = 0;
  double work_result = 0;
  if (me == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    W().all_reduce(t);
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    auto h = W().all_reduce_async(t, ReduceOp::Sum);
    const auto t0 = std::chrono::steady_clock::now();
    double x = 1;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1))
      for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
    work_result = x;
    h->wait();
  }
  EXPECT_TRUE(std::isfinite(work_result));
  expect_values(
      t, [&](int64_t i) { return reduce_expected(ReduceOp::Sum, n, [&](int r) { return value(r, i); }); },
      "overlapped all_reduce");
  const double rank0_wait = W().all_reduce_scalar(waited, ReduceOp::Max);
  EXPECT_LT(rank0_wait, 0.5) << "rank 0 waited " << rank0_wait
                             << " s: the all-reduce did not progress while the other ranks computed";
}

TEST(MpiCommunicator, MpiErrorsAreRethrownByWait) {
  const int n = W().size(), me = W().rank();
  // Rank 0 sends 10 elements to rank 1, which receives them into a tensor of 5 (truncation, MPI's
  // error) and then 10 elements into one of 20 (a short message, Megaton's check).
  if (me == 0) {
    Tensor t = Tensor::zeros({10}, DType::F32, MemCategory::Other, "ten");
    W().send(t, 1, 11);
    W().send(t, 1, 12);
  } else if (me == 1) {
    Tensor five = Tensor::zeros({5}, DType::F32, MemCategory::Other, "five");
    auto h = W().recv_async(five, 0, 11);
    const std::string e = error_message([&] { h->wait(); });
    EXPECT_NE(e.find("MPI error in recv on group 'world' (rank 1 of " + std::to_string(n) + ")"), std::string::npos)
        << e;
    EXPECT_NE(e.find("'five' from rank 0"), std::string::npos) << e;
    EXPECT_FALSE(error_message([&] { h->wait(); }).empty());  // every wait rethrows
    Tensor twenty = Tensor::zeros({20}, DType::F32, MemCategory::Other, "twenty");
    const std::string s = error_message([&] { W().recv(twenty, 0, 12); });
    EXPECT_NE(s.find("received 10 elements where the tensor expects 20"), std::string::npos) << s;
  }
  W().barrier();
}

TEST(MpiCommunicator, ArgumentErrorsNameTheOperationGroupAndTensor) {
  const int n = W().size(), me = W().rank();
  auto expect_error = [](const std::string& e, std::initializer_list<const char*> parts) {
    for (const char* p : parts) EXPECT_NE(e.find(p), std::string::npos) << "'" << p << "' not in: " << e;
  };
  Tensor in = Tensor::zeros({4 * n + 1}, DType::F32, MemCategory::Other, "grad_buffer");
  Tensor out = Tensor::zeros({4}, DType::F32, MemCategory::Other, "grad_shard");
  expect_error(error_message([&] { W().reduce_scatter(out, in); }),
               {"reduce_scatter on group 'world'", "grad_buffer", "grad_shard"});
  expect_error(error_message([&] { W().all_gather(in, out); }), {"all_gather on group 'world'", "grad_buffer"});
  Tensor out64 = Tensor::zeros({4}, DType::F64, MemCategory::Other, "shard64");
  Tensor in32 = Tensor::zeros({4 * n}, DType::F32, MemCategory::Other, "buf32");
  expect_error(error_message([&] { W().reduce_scatter(out64, in32); }), {"reduce_scatter", "f64", "f32"});
  Tensor u8 = Tensor::zeros({4}, DType::U8, MemCategory::Other, "mask");
  expect_error(error_message([&] { W().all_reduce(u8); }), {"all_reduce", "'mask'", "u8", "reductions take"});
  Tensor f16 = Tensor::zeros({4}, DType::F16, MemCategory::Other, "half");
  expect_error(error_message([&] { W().all_reduce(f16, ReduceOp::Max); }), {"all_reduce", "'half'", "f16"});
  // all_to_all: count lists of the wrong length, sums that do not match, negative counts.
  Tensor a = Tensor::zeros({n}, DType::F32, MemCategory::Other, "tokens");
  std::vector<int64_t> ones(n, 1), short_counts(n + 1, 0), twos(n, 2), neg(n, 1);
  neg[0] = -1;
  expect_error(error_message([&] { W().all_to_all(a, ones, a, short_counts); }), {"all_to_all", "counts for a group of"});
  expect_error(error_message([&] { W().all_to_all(a, twos, a, ones); }), {"all_to_all", "output counts sum to", "'tokens'"});
  expect_error(error_message([&] { W().all_to_all(a, ones, a, neg); }), {"all_to_all", "negative"});
  expect_error(error_message([&] { W().broadcast(a, n); }), {"broadcast on group 'world'", "root"});
  expect_error(error_message([&] { W().send(a, me, 0); }), {"send", "this rank"});
  expect_error(error_message([&] { W().recv(a, n, 0); }), {"recv", "peer"});
  expect_error(error_message([&] { W().send(a, (me + 1) % n, -3); }), {"send", "tag -3"});
  expect_error(error_message([&] { W().all_reduce(Tensor{}); }), {"all_reduce", "undefined"});
  // A CUDA tensor, where this build and machine have one.
  Tensor gpu;
  try {
    gpu = Tensor::zeros({4}, DType::F32, MemCategory::Other, "gpu_grads", Device::cuda(0));
  } catch (const Error&) {
  }
  if (gpu.defined()) expect_error(error_message([&] { W().all_reduce(gpu); }), {"all_reduce", "'gpu_grads'", "cuda:0"});
  // Nothing was queued by the failed calls: the group still works.
  EXPECT_EQ(W().all_reduce_scalar(1), n);
}

TEST(MpiCommunicator, ProcessGroupsOverMpi) {
  const int n = W().size(), me = W().rank();
  ProcessGroups g(W(), {.tp = 2});
  EXPECT_EQ(g.layout().dp(), n / 2);
  EXPECT_EQ(g.tp().name(), "tp");
  EXPECT_EQ(g.tp().size(), 2);
  EXPECT_EQ(g.tp().rank(), me % 2);
  EXPECT_EQ(g.dp().size(), n / 2);
  EXPECT_EQ(g.dp().rank(), me / 2);
  EXPECT_EQ(g.coords(), g.layout().coords(me));
  // tp groups {0,1}, {2,3}; dp groups {0,2}, {1,3} (4 ranks) or single ranks (2).
  EXPECT_EQ(g.tp().all_reduce_scalar(me), (me / 2) * 4 + 1);
  double dp_sum = 0;
  for (int r : g.layout().group_ranks(me, ParallelDim::Dp)) dp_sum += r;
  EXPECT_EQ(g.dp().all_reduce_scalar(me), dp_sum);
  EXPECT_EQ(g.pp().size(), 1);
  if (n == 4) {
    ProcessGroups p(W(), {.tp = 2, .pp = 2});
    EXPECT_EQ(p.pp().size(), 2);
    EXPECT_EQ(p.pp().all_reduce_scalar(me), me % 2 == 0 ? 2.0 : 4.0);
    EXPECT_EQ(p.dp().size(), 1);
  }
  EXPECT_THROW(ProcessGroups(W(), {.tp = 3}), Error);
}

}  // namespace
}  // namespace megaton::parallel

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace megaton::parallel;
  if (!megaton::testing::launched_or_explain(argv[0])) return 1;
  Communicator& w = world();
  if (const char* failing = std::getenv("MEGATON_TEST_ABORT_RANK")) {
    // abort_job_test's planted failure: one rank fails while the others wait in an all-reduce it
    // never joins; abort_job must end them all.
    if (w.rank() == std::atoi(failing)) {
      std::fprintf(stderr, "[rank %d] error: planted failure\n", w.rank());
      abort_job(3);
    }
    w.all_reduce_scalar(1.0);
    std::fprintf(stderr, "rank %d finished\n", w.rank());
    return 0;
  }
  return megaton::testing::run_tests_on_every_rank(w);
}
