// Split an indexed dataset into train and validation datasets by whole documents, so no
// document contributes to both.
#pragma once
#include <cstdint>
#include <string>

namespace megaton::data {

struct SplitCounts {
  int64_t train_documents = 0, valid_documents = 0;
};

// Every `valid_every`-th document (1-based: documents valid_every, 2*valid_every, ...) goes to
// validation, the rest to training. Outputs are written atomically.
SplitCounts split_by_documents(const std::string& prefix, const std::string& train_prefix,
                               const std::string& valid_prefix, int64_t valid_every);

}  // namespace megaton::data
