// libFuzzer harness: an HF model folder's config.json (GPT-2 or Llama), as `eval`, `generate` and
// `model.load` read it.
#include "fuzz_input.h"
#include "megaton/models/hf_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::filesystem::create_directories(megaton::fuzz::scratch_dir() / "model");
  megaton::fuzz::write_scratch("model/config.json", megaton::fuzz::as_text(data, size));
  megaton::fuzz::parse_or_reject([&] {
    const auto config = megaton::models::load_hf_config((megaton::fuzz::scratch_dir() / "model").string());
    config.validate();
  });
  return 0;
}
