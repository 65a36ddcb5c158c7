#include "megaton/data/npy_file.h"

#include <charconv>
#include <cstring>

#include "megaton/core/atomic_file.h"
#include "megaton/core/checked.h"

namespace megaton::data {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
constexpr size_t kPreludeBytes = kMagicBytes + 2 + 2;  // magic, version 1.0, u16 header length
constexpr size_t kAlign = 64;                          // numpy aligns the data to 64 bytes

// The text after `'key': ` in a header dict, up to the end of the header.
std::string_view value_of(std::string_view header, std::string_view key, const std::string& path) {
  std::string quoted(1, '\'');
  quoted.append(key).append("':");
  const size_t at = header.find(quoted);
  if (at == std::string_view::npos) fail(path, ": .npy header has no '", key, "' entry");
  std::string_view rest = header.substr(at + quoted.size());
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  return rest;
}

}  // namespace

void write_npy(const std::string& path, std::string_view descr, const std::vector<int64_t>& shape, const void* data,
               size_t bytes) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (n,) for one dimension, (n, m) for more
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(kAlign - (kPreludeBytes + header.size() + 1) % kAlign, ' ');
  header += '\n';
  const auto len = static_cast<uint16_t>(header.size());
  const uint8_t version[2] = {1, 0};

  AtomicFile f(path);
  f.write(kMagic, kMagicBytes);
  f.write(version, 2);
  f.write(&len, 2);  // little-endian host (as indexed_dataset.cpp asserts)
  f.write(header.data(), header.size());
  f.write(data, bytes);
  f.commit();
}

NpyArray::NpyArray(const std::string& path) : file_(path, ".npy index file") {
  const uint8_t* p = file_.data();
  if (file_.size() < kPreludeBytes || std::memcmp(p, kMagic, kMagicBytes) != 0)
    fail(path, ": not a .npy file (bad magic)");
  if (p[6] != 1) fail(path, ": .npy format version ", int{p[6]}, ".", int{p[7]}, " is not supported (expected 1.0)");
  uint16_t len;
  std::memcpy(&len, p + 8, 2);
  offset_ = kPreludeBytes + len;
  if (offset_ > file_.size()) fail(path, ": truncated .npy header");
  const std::string_view header(reinterpret_cast<const char*>(p + kPreludeBytes), len);

  std::string_view descr = value_of(header, "descr", path);
  const size_t close = descr.find('\'', 1);
  if (descr.empty() || descr.front() != '\'' || close == std::string_view::npos)
    fail(path, ": malformed 'descr' in the .npy header");
  descr_ = std::string(descr.substr(1, close - 1));
  if (!value_of(header, "fortran_order", path).starts_with("False"))
    fail(path, ": Fortran-ordered .npy arrays are not supported");
  // "(n,)", "(n, m)", "()": non-negative integers separated by commas; the element count overflow-checked.
  std::string_view dims = value_of(header, "shape", path);
  const size_t paren = dims.find(')');
  if (dims.empty() || dims.front() != '(' || paren == std::string_view::npos)
    fail(path, ": malformed 'shape' in the .npy header");
  dims = dims.substr(1, paren - 1);
  auto malformed = [&] {
    fail(path, ": malformed 'shape' (", dims, ") in the .npy header: expected non-negative integers");
  };
  int64_t count = 1;
  for (size_t i = 0; i < dims.size();) {
    auto skip_spaces = [&] {
      while (i < dims.size() && dims[i] == ' ') ++i;
    };
    skip_spaces();
    if (i == dims.size()) break;
    int64_t d = 0;
    if (dims[i] < '0' || dims[i] > '9') malformed();
    const auto [end, ec] = std::from_chars(dims.data() + i, dims.data() + dims.size(), d);
    if (ec != std::errc()) malformed();  // out of int64's range
    i = static_cast<size_t>(end - dims.data());
    shape_.push_back(d);
    count = checked_mul(path + ": .npy shape", count, d);
    skip_spaces();
    if (i < dims.size() && dims[i++] != ',') malformed();
  }

  const size_t elem = descr_.size() == 3 && (descr_[2] == '4' || descr_[2] == '8') ? descr_[2] - '0' : 0;
  if (elem == 0) fail(path, ": unsupported .npy dtype '", descr_, "'");
  if (offset_ % elem != 0) fail(path, ": .npy data at offset ", offset_, " is not aligned");
  const int64_t bytes = checked_mul(path + ": .npy shape", count, static_cast<int64_t>(elem));
  if (file_.size() - offset_ != static_cast<uint64_t>(bytes))
    fail(path, ": .npy data is ", file_.size() - offset_, " bytes, but shape and dtype need ", bytes);
  count_ = static_cast<size_t>(count);
}

}  // namespace megaton::data
