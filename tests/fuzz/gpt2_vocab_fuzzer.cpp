// libFuzzer harness: a GPT-2 tokenizer folder, vocab.json then merges.txt (split by the part
// separator), loaded by `--tokenizer gpt2:DIR` and used to encode and decode.
#include "bpe_round_trip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = megaton::fuzz::split_parts(data, size, 2);
  std::filesystem::create_directories(megaton::fuzz::scratch_dir() / "gpt2");
  megaton::fuzz::write_scratch("gpt2/vocab.json", parts[0]);
  megaton::fuzz::write_scratch("gpt2/merges.txt", parts[1]);
  megaton::fuzz::check_bpe_round_trip("gpt2:" + (megaton::fuzz::scratch_dir() / "gpt2").string());
  return 0;
}
