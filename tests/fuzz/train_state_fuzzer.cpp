// libFuzzer harness: a checkpoint's state.json, parsed as resuming parses it (for the default config,
// seed 1234) and the data position computed from it.
#include "fuzz_input.h"
#include "megaton/train/train_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const megaton::train::TrainConfig config;
  megaton::fuzz::parse_or_reject([&] {
    nlohmann::json state;
    try {
      state = nlohmann::json::parse(megaton::fuzz::as_text(data, size));
    } catch (const nlohmann::json::exception&) {
      return;  // load_checkpoint reports invalid JSON naming state.json
    }
    int64_t optimizer_steps = 0;
    const auto progress = megaton::train::state_from_json(state, config, "state.json", &optimizer_steps);
    (void)progress.next_batch(config.global_batch_size);
    (void)progress.lr_multiplier(progress.step);
  });
  return 0;
}
