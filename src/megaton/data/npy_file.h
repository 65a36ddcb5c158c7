// NumPy .npy files (format version 1.0) for the sampling indices cached next to a dataset: the format
// Megatron caches its indices in, so they can be inspected or compared with numpy.load. Only what the
// caches need: little-endian integer arrays in C order.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/data/mapped_file.h"

namespace megaton::data {

// numpy's type string of T ("<i4", "<i8", ...).
template <typename T>
constexpr std::string_view npy_descr() {
  static_assert(std::is_integral_v<T> && std::is_signed_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
  return sizeof(T) == 4 ? "<i4" : "<i8";
}

// Writes path atomically (temporary name, then rename).
void write_npy(const std::string& path, std::string_view descr, const std::vector<int64_t>& shape, const void* data,
               size_t bytes);

template <typename T>
void write_npy(const std::string& path, std::span<const T> values, const std::vector<int64_t>& shape) {
  write_npy(path, npy_descr<T>(), shape, values.data(), values.size_bytes());
}

// A memory-mapped .npy file; errors name the file.
class NpyArray {
 public:
  explicit NpyArray(const std::string& path);

  const std::vector<int64_t>& shape() const { return shape_; }
  // The elements, checking that the file holds T.
  template <typename T>
  std::span<const T> values() const {
    if (descr_ != npy_descr<T>()) fail(file_.path(), ": holds dtype ", descr_, ", expected ", npy_descr<T>());
    return {reinterpret_cast<const T*>(file_.data() + offset_), count_};
  }

 private:
  MappedFile file_;
  std::string descr_;
  std::vector<int64_t> shape_;
  size_t offset_ = 0;  // where the data starts: after the header, a multiple of 64 bytes
  size_t count_ = 0;
};

}  // namespace megaton::data
