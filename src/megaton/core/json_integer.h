// Integers read from JSON files we did not write (checkpoint manifests, shard indices, state.json).
// nlohmann's get<int64_t>() on a float (1e30) or on an unsigned above INT64_MAX converts without a
// range check, which is undefined behaviour; these check the kind and the range first and fail with
// an error naming what was read.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace megaton {

// v as an integer in [lo, hi], or "<what> must be an integer in [lo, hi], got <v>".
int64_t json_integer(const nlohmann::json& v, std::string_view what, int64_t lo, int64_t hi);

// v as any uint64 (sizes in bytes, 64-bit checksums), or "<what> must be an unsigned 64-bit integer".
uint64_t json_uint64(const nlohmann::json& v, std::string_view what);

}  // namespace megaton
