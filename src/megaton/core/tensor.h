// One Tensor type: shape + dtype tag + device over contiguous storage obtained from that device's
// accounting allocator. Copies share storage (like torch); clone() copies the bytes. A tensor may be a
// contiguous window of its storage (an element offset plus its own shape): row slices and the
// per-parameter views into flat gradient / weight buffers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megaton/core/allocator.h"
#include "megaton/core/device.h"
#include "megaton/core/dtype.h"
#include "megaton/core/error.h"

namespace megaton {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  Storage(size_t bytes, MemCategory cat, std::string_view what, Device device = Device::cpu());
  // Host memory this storage does not own (a mapped file's pages): `owner` keeps it alive while any
  // tensor views it, and the allocator neither hands it out nor counts it.
  Storage(std::shared_ptr<const void> owner, void* data, size_t bytes, MemCategory cat);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return cat_; }
  Device device() const { return device_; }
  bool borrowed() const { return owner_ != nullptr; }

 private:
  Device device_;
  void* data_;
  size_t bytes_;
  MemCategory cat_;
  std::shared_ptr<const void> owner_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, MemCategory cat = MemCategory::Other, std::string name = {},
                      Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, MemCategory cat = MemCategory::Other, std::string name = {},
                      Device device = Device::cpu());
  // A host tensor over `data`, which `owner` keeps alive (see Storage); not counted by the allocator.
  static Tensor borrowed(std::shared_ptr<const void> owner, void* data, Shape shape, DType dtype, MemCategory cat,
                         std::string name);
  // Whether the bytes belong to something else (a mapped file) rather than to the allocator.
  bool borrowed() const;

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  MemCategory category() const;
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }

  void* raw() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_))
                    : nullptr;
  }
  int64_t storage_offset() const { return offset_; }  // in elements
  bool shares_storage_with(const Tensor& other) const { return storage_ && storage_ == other.storage_; }
  // Typed access; throws naming the tensor if T does not match the dtype tag. On a CUDA tensor the
  // pointer is a device pointer, for kernels only.
  template <typename T>
  T* data() const {
    if (dtype_of<T>() != dtype_)
      fail("tensor '", name_, "' holds ", dtype_name(dtype_), ", accessed as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same element count.
  Tensor view(Shape shape) const;
  // Same storage: `shape` laid out from element `offset` of this tensor (flattened); the window
  // must lie inside this tensor. The view is named `name` (for errors and checkpoints).
  Tensor window(int64_t offset, Shape shape, std::string name) const;
  // Same storage: rows [begin, end) along dimension 0.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  Tensor clone(MemCategory cat) const;
  void zero_();
  // Copy of every element; shapes must agree. Between dtypes (f32/f64/bf16/f16 and integer types)
  // on the host; between devices with the same dtype.
  void copy_from(const Tensor& src);
  Tensor to(DType dtype, MemCategory cat = MemCategory::Other) const;
  Tensor to(Device device, MemCategory cat = MemCategory::Other) const;

  // Throw an error naming this tensor unless its shape is `expected`.
  void expect_shape(const Shape& expected) const;

 private:
  // Shape, dtype and name checked and set; the caller attaches the storage.
  static Tensor without_storage(Shape shape, DType dtype, std::string name);

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  int64_t numel_ = 0;
  int64_t offset_ = 0;  // elements from the start of storage_
  DType dtype_ = DType::F32;
  std::string name_;
};

}  // namespace megaton
