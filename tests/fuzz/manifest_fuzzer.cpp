// libFuzzer harness: a checkpoint's manifest.json, verified against a checkpoint folder holding one
// file, as resuming does before it trusts a checkpoint.
#include "fuzz_input.h"
#include "megaton/ckpt/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::filesystem::create_directories(megaton::fuzz::scratch_dir() / "step_000001");
  // The seed corpus's valid manifest lists this file with its size and checksum.
  megaton::fuzz::write_scratch("step_000001/state.json", "{}\n");
  megaton::fuzz::write_scratch("step_000001/manifest.json", megaton::fuzz::as_text(data, size));
  megaton::fuzz::parse_or_reject(
      [&] { megaton::ckpt::verify_manifest((megaton::fuzz::scratch_dir() / "step_000001").string()); });
  return 0;
}
