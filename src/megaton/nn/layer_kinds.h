// The choices a model config makes inside a decoder block that are plain enums (the attention and
// MLP kinds are named strings, see block_spec.h). Kept apart so the config can name them without
// pulling in the modules.
#pragma once

namespace megaton::nn {

enum class Normalization { LayerNorm, RMSNorm };
enum class Activation { GeLU, SwiGLU };  // SwiGLU: fc1 produces [gate | up]

}  // namespace megaton::nn
