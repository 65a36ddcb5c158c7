// The byte-level BPE tokenizer harnesses' property: a vocabulary that loads must encode any bytes into
// ids in its range that decode back to the same bytes (README: "byte-level BPE round-trips any bytes").
#pragma once
#include <memory>
#include <string>

#include "fuzz_input.h"
#include "megaton/data/tokenizer.h"

namespace megaton::fuzz {

inline void check_bpe_round_trip(const std::string& spec) {
  parse_or_reject([&] {
    const auto tok = data::make_tokenizer(spec);
    const std::string text = "Hello, world!  It's 2024:\n\tnaive caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xff\x00z";
    const auto ids = tok->encode(text);
    for (int32_t id : ids) require(id >= 0 && id < tok->vocab_size());
    require(tok->decode(ids) == text);
  });
}

}  // namespace megaton::fuzz
