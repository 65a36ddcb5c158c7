#include "megaton/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "megaton/core/checked.h"
#include "megaton/core/fp8_format.h"

#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

namespace megaton {

namespace {

template <typename To, typename From, typename F>
void convert_elements(void* dst, const void* src, int64_t n, F convert) {
  To* d = static_cast<To*>(dst);
  const From* s = static_cast<const From*>(src);
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] = convert(s[i]);
}

// The conversions a mixed-precision step makes every step (compute copies of every weight after the
// optimizer, attention's qkv widened to f32 and its output rounded back): elementwise, so split over threads
// with the same result for any thread count, and written for the compiler to vectorise. Bitwise what
// float_to_bf16 / float_to_f16 and their inverses give. False for the pairs it does not handle.
bool convert_float_pair(void* dst, DType to, const void* src, DType from, int64_t n) {
  if (from == DType::F32 && to == DType::BF16)
    convert_elements<uint16_t, float>(dst, src, n, [](float f) { return float_to_bf16(f); });
  else if (from == DType::BF16 && to == DType::F32)
    convert_elements<float, uint16_t>(dst, src, n, [](uint16_t h) { return bf16_to_float(h); });
  else if (from == DType::F32 && to == DType::F16)
    convert_elements<uint16_t, float>(dst, src, n, [](float f) { return float_to_f16(f); });
  else if (from == DType::F16 && to == DType::F32)
    convert_elements<float, uint16_t>(dst, src, n, [](uint16_t h) { return f16_to_float(h); });
  else
    return false;
  return true;
}

}  // namespace

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) fail("negative dimension in shape ", shape_str(s));
    n = checked_mul("shape " + shape_str(s), n, d);
  }
  return n;
}

Storage::Storage(size_t bytes, MemCategory cat, std::string_view what, Device device)
    : device_(device), data_(Allocator::of(device).allocate(bytes, cat, what)), bytes_(bytes), cat_(cat) {}
Storage::Storage(std::shared_ptr<const void> owner, void* data, size_t bytes, MemCategory cat)
    : device_(Device::cpu()), data_(data), bytes_(bytes), cat_(cat), owner_(std::move(owner)) {}
Storage::~Storage() {
  if (!owner_) Allocator::of(device_).deallocate(data_, bytes_, cat_);
}

Tensor Tensor::without_storage(Shape shape, DType dtype, std::string name) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  checked_mul("tensor '" + name + "' of shape " + shape_str(shape), t.numel_, static_cast<int64_t>(dtype_size(dtype)));
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.name_ = std::move(name);
  return t;
}

Tensor Tensor::empty(Shape shape, DType dtype, MemCategory cat, std::string name, Device device) {
  Tensor t = without_storage(std::move(shape), dtype, std::move(name));
  t.storage_ = std::make_shared<Storage>(t.nbytes(), cat, t.name_, device);
  return t;
}

Tensor Tensor::borrowed(std::shared_ptr<const void> owner, void* data, Shape shape, DType dtype, MemCategory cat,
                        std::string name) {
  MEGATON_CHECK(owner != nullptr, "borrowed tensor '", name, "' has no owner keeping its bytes alive");
  Tensor t = without_storage(std::move(shape), dtype, std::move(name));
  t.storage_ = std::make_shared<Storage>(std::move(owner), data, t.nbytes(), cat);
  return t;
}

bool Tensor::borrowed() const { return storage_ && storage_->borrowed(); }

Tensor Tensor::zeros(Shape shape, DType dtype, MemCategory cat, std::string name, Device device) {
  Tensor t = empty(std::move(shape), dtype, cat, std::move(name), device);
  t.zero_();
  return t;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n;
  if (d < 0 || d >= n) fail("tensor '", name_, "' of shape ", shape_str(shape_), " has no dimension ", d);
  return shape_[static_cast<size_t>(d)];
}

MemCategory Tensor::category() const { return storage_ ? storage_->category() : MemCategory::Other; }

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel_)
    fail("cannot view tensor '", name_, "' of shape ", shape_str(shape_), " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::window(int64_t offset, Shape shape, std::string name) const {
  const int64_t n = shape_numel(shape);
  if (offset < 0 || offset > numel_ || n > numel_ - offset)
    fail("window of ", shape_str(shape), " at element ", offset, " lies outside tensor '", name_, "' of ",
         numel_, " elements");
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.numel_ = n;
  t.shape_ = std::move(shape);
  t.name_ = std::move(name);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  const int64_t rows = size(0);
  if (begin < 0 || begin > end || end > rows)
    fail("rows [", begin, ", ", end, ") out of range for tensor '", name_, "' of shape ", shape_str(shape_));
  Shape shape = shape_;
  shape[0] = end - begin;
  const int64_t row_elems = rows ? numel_ / rows : 0;
  return window(begin * row_elems, std::move(shape), name_);
}

Tensor Tensor::clone(MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, cat, name_, device());
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (!nbytes()) return;
  if (device().is_cpu()) {
    // Split over the threads in 1 MiB pieces: one core's memset does not reach the memory's write
    // bandwidth (gpt2-124m's 498 MB gradient buffer: 0.050 s on one core of an AMX Xeon).
    constexpr size_t kPiece = size_t{1} << 20;
    char* p = static_cast<char*>(raw());
    const size_t n = nbytes(), pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (size_t i = 0; i < pieces; ++i) std::memset(p + i * kPiece, 0, std::min(kPiece, n - i * kPiece));
    return;
  }
#ifdef MEGATON_WITH_CUDA
  cuda::zero_bytes(raw(), device().index, nbytes());
#endif
}

namespace {
double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::U8: return static_cast<const uint8_t*>(p)[i];
    case DType::I8: return static_cast<const int8_t*>(p)[i];
    case DType::U16: return static_cast<const uint16_t*>(p)[i];
    case DType::I16: return static_cast<const int16_t*>(p)[i];
    case DType::U32: return static_cast<const uint32_t*>(p)[i];
    case DType::U64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DType::F8E4M3: return fp8::decode(static_cast<const uint8_t*>(p)[i], fp8::Format::E4M3);
    case DType::F8E5M2: return fp8::decode(static_cast<const uint8_t*>(p)[i], fp8::Format::E5M2);
  }
  return 0;
}
void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::U8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::I8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::U16: static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); break;
    case DType::I16: static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v); break;
    case DType::U32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); break;
    case DType::U64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); break;
    // Unscaled and saturating: a cast, not a quantisation (kernels/fp8_quantize.h scales).
    case DType::F8E4M3: static_cast<uint8_t*>(p)[i] = fp8::encode(static_cast<float>(v), fp8::Format::E4M3); break;
    case DType::F8E5M2: static_cast<uint8_t*>(p)[i] = fp8::encode(static_cast<float>(v), fp8::Format::E5M2); break;
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  if (src.numel_ != numel_)
    fail("copy into tensor '", name_, "' of shape ", shape_str(shape_), " from '", src.name_, "' of shape ",
         shape_str(src.shape_));
  if (!device().is_cpu() || !src.device().is_cpu()) {
    if (src.dtype_ != dtype_)
      fail("copy into tensor '", name_, "' (", dtype_name(dtype_), ", ", device().str(), ") from '", src.name_, "' (",
           dtype_name(src.dtype_), ", ", src.device().str(), "): converting copies run on the host");
#ifdef MEGATON_WITH_CUDA
    cuda::copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
#endif
    return;
  }
  if (src.dtype_ == dtype_) {
    if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  if (convert_float_pair(raw(), dtype_, src.raw(), src.dtype_, numel_)) return;
  // Other converting copies are rare (load/save, tests); precision through double is exact for
  // every supported pair except 64-bit integers above 2^53, which no caller stores.
  for (int64_t i = 0; i < numel_; ++i) store_from_double(raw(), dtype_, i, load_as_double(src.raw(), src.dtype_, i));
}

Tensor Tensor::to(DType dtype, MemCategory cat) const {
  Tensor t = empty(shape_, dtype, cat, name_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device, MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, cat, name_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::expect_shape(const Shape& expected) const {
  if (shape_ != expected)
    fail("tensor '", name_, "' has shape ", shape_str(shape_), ", expected ", shape_str(expected));
}

}  // namespace megaton
