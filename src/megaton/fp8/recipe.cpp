#include "megaton/fp8/recipe.h"

#include "megaton/core/error.h"

namespace megaton::fp8 {

Recipe recipe_from_name(std::string_view name) {
  for (Recipe r : {Recipe::Delayed, Recipe::Tensorwise, Recipe::Blockwise, Recipe::Mxfp8})
    if (recipe_name(r) == name) return r;
  fail("unknown fp8_recipe '", name, "' (expected delayed, tensorwise, blockwise or mxfp8)");
}

std::string_view recipe_name(Recipe r) {
  switch (r) {
    case Recipe::Delayed: return "delayed";
    case Recipe::Tensorwise: return "tensorwise";
    case Recipe::Blockwise: return "blockwise";
    case Recipe::Mxfp8: return "mxfp8";
  }
  return "?";
}

bool hybrid_from_format_name(std::string_view name) {
  if (name == "e4m3") return false;
  if (name == "hybrid") return true;
  fail("unknown fp8 format '", name, "' (expected e4m3 or hybrid)");
}

kernels::Fp8Granularity Fp8Config::activation_granularity() const {
  switch (recipe) {
    case Recipe::Blockwise: return kernels::Fp8Granularity::Tile1x128;
    case Recipe::Mxfp8: return kernels::Fp8Granularity::Mx1x32;
    default: return kernels::Fp8Granularity::Tensor;
  }
}

kernels::Fp8Granularity Fp8Config::weight_granularity() const {
  switch (recipe) {
    case Recipe::Blockwise: return kernels::Fp8Granularity::Block128x128;
    case Recipe::Mxfp8: return kernels::Fp8Granularity::Mx1x32;
    default: return kernels::Fp8Granularity::Tensor;
  }
}

}  // namespace megaton::fp8
