// libFuzzer harness: a .tiktoken rank file, loaded by `--tokenizer tiktoken:FILE` and used to encode
// and decode.
#include "bpe_round_trip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = megaton::fuzz::write_scratch("ranks.tiktoken", megaton::fuzz::as_text(data, size));
  megaton::fuzz::check_bpe_round_trip("tiktoken:" + path);
  return 0;
}
