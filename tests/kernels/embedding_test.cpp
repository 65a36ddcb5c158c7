#include "megaton/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <vector>

#include "finite_diff.h"

using namespace megaton;
using namespace megaton::kernels;
using namespace megaton::kernels::cpu;

namespace {

constexpr int64_t kB = 3, kT = 17, kC = 37, kVocab = 11;  // 51 tokens over 11 ids: many repeats

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens(n);
  std::vector<double> u = fd::random_vector(n, seed, 0.0, 1.0);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(u[i] * vocab);
  return tokens;
}

}  // namespace

TEST(Embedding, ForwardMatchesLookupPlusPosition) {
  auto tokens = random_tokens(kB * kT, kVocab, 1);
  auto wte = fd::random_vector<float>(kVocab * kC, 2);
  auto wpe = fd::random_vector<float>(kT * kC, 3);
  std::vector<float> out(kB * kT * kC), out_nopos(kB * kT * kC);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC);
  embedding_forward(out_nopos.data(), tokens.data(), wte.data(), static_cast<const float*>(nullptr), kB, kT, kC);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t c = 0; c < kC; ++c) {
        const int64_t row = b * kT + t;
        const float e = wte[tokens[row] * kC + c];
        EXPECT_EQ(out[row * kC + c], e + wpe[t * kC + c]);
        EXPECT_EQ(out_nopos[row * kC + c], e);
      }
}

// Loss = sum(dout * out). The weight gradients start non-zero to check they are accumulated.
TEST(Embedding, GradientsMatchFiniteDifferencesAndAccumulate) {
  auto tokens = random_tokens(kB * kT, kVocab, 4);
  auto wte = fd::random_vector(kVocab * kC, 5);
  auto wpe = fd::random_vector(kT * kC, 6);
  auto dout = fd::random_vector(kB * kT * kC, 7);
  std::vector<double> out(dout.size());
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC);
    return fd::dot(dout, out);
  };
  std::vector<double> dwte(wte.size(), 0.5), dwpe(wpe.size(), -0.25);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kB, kT, kC);
  for (double& g : dwte) g -= 0.5;
  for (double& g : dwpe) g += 0.25;
  EXPECT_TRUE(fd::close(dwte, fd::numeric_gradient(wte, loss), 1e-8));
  EXPECT_TRUE(fd::close(dwpe, fd::numeric_gradient(wpe, loss), 1e-8));
}

TEST(Embedding, BackwardWithoutPositionTableSumsTokenRows) {
  auto tokens = random_tokens(kB * kT, kVocab, 8);
  auto dout = fd::random_vector(kB * kT * kC, 9);
  std::vector<double> dwte(kVocab * kC, 0.0), expected(kVocab * kC, 0.0);
  embedding_backward(dwte.data(), static_cast<double*>(nullptr), dout.data(), tokens.data(), kB, kT, kC);
  for (int64_t row = 0; row < kB * kT; ++row)
    for (int64_t c = 0; c < kC; ++c) expected[tokens[row] * kC + c] += dout[row * kC + c];
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(dwte[i], expected[i], 1e-12);
}

TEST(Embedding, BackwardIsBitwiseIdenticalForOneAndTwoThreads) {
  const int64_t B = 4, T = 257, C = 64, vocab = 50;
  auto tokens = random_tokens(B * T, vocab, 10);
  auto dout = fd::random_vector<float>(B * T * C, 11);
  auto run = [&](int threads) {
    std::vector<float> dwte(vocab * C, 0.0f), dwpe(T * C, 0.0f);
    fd::with_threads(threads,
                     [&] { embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C); });
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  EXPECT_TRUE(fd::same_bits(run(1), run(2)));
}
