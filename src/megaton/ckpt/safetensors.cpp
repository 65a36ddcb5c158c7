#include "megaton/ckpt/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "megaton/core/atomic_file.h"
#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"

namespace megaton::ckpt {

// Tensor bytes are copied as they lie in memory, and the format stores them little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr size_t kDataAlignment = 64;

// Safetensors dtype names in megaton::DType order.
constexpr std::array<std::string_view, 14> kDTypeNames{"F32", "F64", "BF16", "F16", "I32",     "I64",    "U8",
                                                       "I8",  "U16", "I16",  "U32", "U64", "F8_E4M3", "F8_E5M2"};

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (size_t i = 0; i < kDTypeNames.size(); ++i)
    if (kDTypeNames[i] == name) return static_cast<DType>(i);
  return std::nullopt;
}

template <typename... Args>
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, Args&&... args) {
  fail(path, ": tensor '", name, "': ", std::forward<Args>(args)...);
}

// One header entry after validation; begin/end are relative to the start of the data section.
struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

HeaderEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v, uint64_t data_bytes) {
  if (!v.is_object()) fail_tensor(path, name, "header entry is not a JSON object");
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) fail_tensor(path, name, "missing \"dtype\" string");
  auto dtype = dtype_from_safetensors(dt->get<std::string>());
  if (!dtype)
    fail_tensor(path, name, "unsupported dtype '", dt->get<std::string>(),
                "' (supported: F32, F64, BF16, F16, I32, I64, U8, I8, U16, I16, U32, U64, F8_E4M3, F8_E5M2)");

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) fail_tensor(path, name, "missing \"shape\" array");
  HeaderEntry e{name, *dtype, {}, 0, 0};
  uint64_t bytes = dtype_size(*dtype);
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())
      fail_tensor(path, name, "shape ", sh->dump(), " has a non-integer or negative dimension");
    uint64_t n = d.get<uint64_t>();
    if (n > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, n, &bytes))
      fail_tensor(path, name, "shape ", sh->dump(), " overflows 64-bit byte counts");
    e.shape.push_back(static_cast<int64_t>(n));
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    fail_tensor(path, name, "\"data_offsets\" must be two non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes)
    fail_tensor(path, name, "data_offsets [", e.begin, ", ", e.end, "] out of range: the data section has ", data_bytes,
                " bytes (truncated file?)");
  if (e.end - e.begin != bytes)
    fail_tensor(path, name, "data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin, " bytes but ",
                kDTypeNames[static_cast<size_t>(*dtype)], " ", shape_str(e.shape), " needs ", bytes);
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const nlohmann::json& v) {
  if (!v.is_object()) fail(path, ": \"", kMetadataKey, "\" is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [k, s] : v.items()) {
    if (!s.is_string()) fail(path, ": metadata value for '", k, "' is not a string");
    out[k] = s.get<std::string>();
  }
  return out;
}

// The format requires the tensors to tile the data section exactly: no overlaps (aliasing), no holes and
// no trailing bytes (which would let a file carry hidden content).
void check_tiling(const std::string& path, std::vector<HeaderEntry>& entries, uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(),
            [](const HeaderEntry& a, const HeaderEntry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t expected = 0;
  const HeaderEntry* prev = nullptr;
  for (const HeaderEntry& e : entries) {
    if (e.begin < expected)
      fail_tensor(path, e.name, "data_offsets [", e.begin, ", ", e.end, "] overlap tensor '", prev->name, "' [",
                  prev->begin, ", ", prev->end, "]");
    if (e.begin > expected)
      fail_tensor(path, e.name, "data starts at ", e.begin, ", leaving a gap after byte ", expected);
    expected = e.end;
    prev = &e;
  }
  if (expected != data_bytes)
    fail(path, ": tensors cover ", expected, " data bytes but the file holds ", data_bytes, " (trailing bytes)");
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

void read_at(std::FILE* f, const std::string& path, uint64_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0 || std::fread(dst, 1, bytes, f) != bytes)
    fail(path, ": cannot read ", bytes, " bytes at offset ", offset, ": ",
         std::feof(f) ? "unexpected end of file" : std::strerror(errno));
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the caller's order, which is also the data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) fail("cannot save a tensor named '", kMetadataKey, "' to ", path, " (reserved key)");
    if (!seen.insert(name).second) fail("duplicate tensor name '", name, "' saving ", path);
    if (!t.defined()) fail("tensor '", name, "' is undefined; cannot save it to ", path);
    header[name] = {{"dtype", kDTypeNames[static_cast<size_t>(t.dtype())]},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("cannot encode the safetensors header of ", path, " (tensor names and metadata must be UTF-8): ", e.what());
  }
  // Padding starts the data section on a 64-byte boundary (the format asks for 8): a reader that maps
  // the file in place then finds each tensor whose predecessors' sizes are multiples of 64 bytes (every
  // weight matrix with a multiple of 16 columns) on a cache line, where vector loads do not split.
  text.append((kDataAlignment - (8 + text.size()) % kDataAlignment) % kDataAlignment, ' ');
  uint64_t header_bytes = text.size();

  AtomicFile out(path);
  out.write(&header_bytes, sizeof header_bytes);
  out.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) out.write(t.raw(), t.nbytes());
  out.commit();
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  file_ = fopen_regular_file(path_, "safetensors file");
  std::unique_ptr<std::FILE, FileCloser> guard(file_);  // released once the header checks out
  std::FILE* f = file_;
  if (fseeko(f, 0, SEEK_END) != 0) fail("cannot seek in ", path_, ": ", std::strerror(errno));
  const uint64_t file_bytes = file_bytes_ = static_cast<uint64_t>(ftello(f));
  if (file_bytes < 8)
    fail(path_, ": truncated safetensors file (", file_bytes, " bytes; the header length alone takes 8)");

  uint64_t header_bytes = 0;
  read_at(f, path_, 0, &header_bytes, sizeof header_bytes);
  if (header_bytes > file_bytes - 8)
    fail(path_, ": header length ", header_bytes, " runs past the end of the file (", file_bytes,
         " bytes): truncated or not a safetensors file");
  std::string text(header_bytes, '\0');
  read_at(f, path_, 8, text.data(), text.size());

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    fail(path_, ": corrupt safetensors header (invalid JSON): ", e.what());
  }
  if (!header.is_object()) fail(path_, ": safetensors header is not a JSON object");

  data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start_;
  std::vector<HeaderEntry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey)
      metadata_ = parse_metadata(path_, value);
    else
      entries.push_back(parse_entry(path_, key, value, data_bytes));
  }
  check_tiling(path_, entries, data_bytes);
  for (HeaderEntry& e : entries) {
    order_.push_back(e.name);
    entries_.emplace(e.name, Entry{e.dtype, std::move(e.shape), e.begin, e.end});
  }
  guard.release();
}

SafetensorsReader::~SafetensorsReader() {
  if (file_) std::fclose(file_);
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail(path_, ": no tensor '", name, "'");
  return it->second;
}

DType SafetensorsReader::dtype(const std::string& name) const { return entry(name).dtype; }
const Shape& SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }
std::vector<std::string> SafetensorsReader::names() const { return order_; }

Tensor SafetensorsReader::read(const std::string& name, MemCategory cat) const {
  const Entry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype, cat, name);
  read_at(file_, path_, data_start_ + e.begin, t.raw(), t.nbytes());
  return t;
}

Tensor SafetensorsReader::map(const std::string& name, MemCategory cat) const {
  const Entry& e = entry(name);
  const uint64_t offset = data_start_ + e.begin;
  if (offset % dtype_size(e.dtype) != 0) return read(name, cat);
  if (!mapping_) {
    mapping_ = MappedFile::of_descriptor(fileno(file_), path_, "safetensors file");
    if (mapping_->size() != file_bytes_)
      fail(path_, ": the file changed size while open (", file_bytes_, " bytes when its header was read, ",
           mapping_->size(), " now)");
  }
  return Tensor::borrowed(mapping_, mapping_->data() + offset, e.shape, e.dtype, cat, name);
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const SafetensorsReader reader(path);
  std::map<std::string, Tensor> out;
  for (const std::string& name : reader.names()) out.emplace(name, reader.read(name));
  if (metadata) *metadata = reader.metadata();
  return out;
}

}  // namespace megaton::ckpt
