// Tensor<T>: an owning, reference-counted, row-major contiguous array of rank 0..8.
//
// Copies share storage (like a shared_ptr); `clone()` copies the data. `reshape` returns a view on the same
// storage. A tensor lives on one device (cpu or cuda:N); `to(device)` copies it there. Element access (flat,
// operator(), item, span, to_vector) reads host memory, so on a device tensor it throws naming the access and the
// device; `data()` is the raw pointer on any device. Tensors know nothing of the tape.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "tapegrad/tensor/core/device.hpp"
#include "tapegrad/tensor/core/detail/device_checks.hpp"
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/dtype.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"  // (and with it the check that headers and library agree on CUDA)
#include "tapegrad/tensor/shape.hpp"
#include "tapegrad/tensor/storage.hpp"

namespace tapegrad {

namespace detail {
// The bytes a tensor of `shape` and `dtype` takes; throws Error naming the op in scope
// (tensor/core/detail/op_scope.hpp), the shape and the dtype when that is more than memory can address (2^63 - 1
// bytes), before anything is allocated.
std::size_t tensor_bytes(const Shape& shape, DType dtype);
[[noreturn]] void throw_undefined_tensor(std::string_view op, std::string_view what);
[[noreturn]] void throw_flat_index(std::int64_t index, const Shape& shape);
}  // namespace detail

// Throws "<op>: <what> is undefined (a default-constructed Tensor, with no storage)" unless `t` is defined.
template <class T> void check_defined(const T& t, std::string_view op, std::string_view what = "the tensor") {
  if (!t.defined()) [[unlikely]] detail::throw_undefined_tensor(op, what);
}

template <class T> class Tensor {
 public:
  using value_type = T;

  Tensor() = default;  // undefined: no storage; `defined()` is false
  explicit Tensor(Shape shape, Device device = Device::cpu())
      : storage_(Storage::allocate(detail::tensor_bytes(shape, dtype_v<T>), device)),
        shape_(shape),
        device_(device) {}

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t dim(int axis) const { return shape_.dim(axis); }
  static constexpr DType dtype() { return dtype_v<T>; }
  Device device() const { return device_; }

  T* data() { return static_cast<T*>(storage_ ? storage_->data() : nullptr) + offset_; }
  const T* data() const { return static_cast<const T*>(storage_ ? storage_->data() : nullptr) + offset_; }
  std::span<T> span() {
    on_host("span");
    return {data(), static_cast<std::size_t>(numel())};
  }
  std::span<const T> span() const {
    on_host("span");
    return {data(), static_cast<std::size_t>(numel())};
  }

  // Element access by flat (row-major) index, and by multi-index.
  T& flat(std::int64_t i) {
    on_host("flat");
    in_range(i);
    return data()[i];
  }
  const T& flat(std::int64_t i) const {
    on_host("flat");
    in_range(i);
    return data()[i];
  }
  template <class... I> T& operator()(I... idx) {
    on_host("index");
    return data()[offset_of({static_cast<std::int64_t>(idx)...})];
  }
  template <class... I> const T& operator()(I... idx) const {
    on_host("index");
    return data()[offset_of({static_cast<std::int64_t>(idx)...})];
  }
  T item() const {
    on_host("item");
    check(numel() == 1, "item", "tensor of shape ", shape_, " has ", numel(), " elements, not 1");
    return data()[0];
  }

  // A view with a new shape of the same element count, sharing storage.
  Tensor reshape(const Shape& shape) const {
    check(shape.numel() == numel(), "reshape", "cannot view shape ", shape_, " (", numel(),
          " elements) as ", shape, " (", shape.numel(), " elements)");
    Tensor view = *this;
    view.shape_ = shape;
    return view;
  }
  // This tensor on `device`: itself when it is already there, else a copy. A copy to or from the cpu has finished
  // when `to` returns.
  Tensor to(Device device) const { return device == device_ ? *this : copy_to(device); }
  // A copy of the data on the same device (on a GPU, queued on the device's current stream).
  Tensor clone() const { return copy_to(device_); }
  std::vector<T> to_vector() const {
    on_host("to_vector");
    return {data(), data() + numel()};
  }
  // Whether both tensors use the same memory (views of one another).
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
  // Whether no other tensor uses this one's memory (so that writing into it changes no other tensor's value).
  bool owns_storage_alone() const { return storage_.use_count() == 1; }
  // That memory (for what keeps it past the tensor: its contents rewritten in another form).
  const std::shared_ptr<Storage>& storage() const { return storage_; }

 private:
  // Two compares on the access path; the messages are built out of line.
  void on_host(const char* op) const {
    check_defined(*this, op);
    if (!device_.is_cpu()) [[unlikely]] detail::throw_not_on_host(op, device_);
  }
  void in_range(std::int64_t i) const {
    if (static_cast<std::uint64_t>(i) >= static_cast<std::uint64_t>(numel())) [[unlikely]] {
      detail::throw_flat_index(i, shape_);
    }
  }
  Tensor copy_to(Device device) const {
    if (!defined()) return {};
    Tensor copy(shape_, device);
    copy_bytes(copy.data(), device, data(), device_, static_cast<std::size_t>(numel()) * sizeof(T));
    return copy;
  }
  std::int64_t offset_of(std::initializer_list<std::int64_t> idx) const {
    check(static_cast<int>(idx.size()) == rank(), "index", "got ", idx.size(), " indices for a tensor of shape ",
          shape_);
    const auto strides = shape_.strides();
    std::int64_t off = 0;
    int axis = 0;
    for (std::int64_t i : idx) {
      check(i >= 0 && i < shape_[axis], "index", "index ", i, " is out of range for axis ", axis, " of shape ",
            shape_);
      off += i * strides[static_cast<std::size_t>(axis++)];
    }
    return off;
  }

  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;
  Shape shape_;
  Device device_;  // the storage's, kept here so that element access checks it without following the pointer
};

namespace detail {
// The copy of `t` converted to To element by element (tensor/cast.cpp instantiates every pair of dtypes).
template <class To, class From> Tensor<To> converted(const Tensor<From>& t);
}  // namespace detail

// Element-type conversion with round-to-nearest-even, on the tensor's device (bitwise the same on a GPU as on the
// cpu; conversions to or from the integer types run on the cpu only). A cast to the tensor's own dtype is the tensor.
template <class To, class From> Tensor<To> cast(const Tensor<From>& t) {
  if constexpr (std::is_same_v<To, From>) {
    return t;
  } else {
    return detail::converted<To>(t);
  }
}

}  // namespace tapegrad
