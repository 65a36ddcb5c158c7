#include "megaton/core/json_integer.h"

#include "megaton/core/error.h"

namespace megaton {

int64_t json_integer(const nlohmann::json& v, std::string_view what, int64_t lo, int64_t hi) {
  const bool ok = v.is_number_unsigned() ? hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                               static_cast<int64_t>(v.get<uint64_t>()) >= lo
                                         : v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!ok) fail(what, " must be an integer in [", lo, ", ", hi, "], got ", v.dump());
  return v.get<int64_t>();
}

uint64_t json_uint64(const nlohmann::json& v, std::string_view what) {
  if (!v.is_number_unsigned()) fail(what, " must be an unsigned 64-bit integer, got ", v.dump());
  return v.get<uint64_t>();
}

}  // namespace megaton
