// libFuzzer harness: a safetensors file (the 8-byte header length, the JSON header, the tensor bytes),
// read as `eval --model` and checkpoint resume read model.safetensors.
#include "fuzz_input.h"
#include "megaton/ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = megaton::fuzz::write_scratch("model.safetensors", megaton::fuzz::as_text(data, size));
  megaton::fuzz::parse_or_reject([&] {
    std::map<std::string, std::string> metadata;
    for (const auto& [name, t] : megaton::ckpt::load_safetensors(path, &metadata))
      megaton::fuzz::require(t.defined() && t.name() == name);
  });
  return 0;
}
