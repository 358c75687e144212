// AnyTensor: a Tensor<T> of any element type, for what holds tensors of mixed dtypes (a safetensors file, a state
// dict). It shares the tensor's storage, as a Tensor copy does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <variant>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

class AnyTensor {
 public:
  using Variant = std::variant<Tensor<float>, Tensor<double>, Tensor<bf16>, Tensor<f16>, Tensor<std::int32_t>,
                               Tensor<std::int64_t>, Tensor<f8e4m3>, Tensor<f8e5m2>>;

  AnyTensor() = default;  // undefined
  template <class T> AnyTensor(Tensor<T> t) : tensor_(std::move(t)) {}  // NOLINT: implicit, as a Tensor is one

  // A tensor of `dtype` and `shape` on `device`, its elements not set.
  static AnyTensor empty(DType dtype, const Shape& shape, Device device = Device::cpu());

  bool defined() const { return std::visit([](const auto& t) { return t.defined(); }, tensor_); }
  DType dtype() const { return std::visit([](const auto& t) { return t.dtype(); }, tensor_); }
  const Shape& shape() const { return std::visit([](const auto& t) -> const Shape& { return t.shape(); }, tensor_); }
  Device device() const { return std::visit([](const auto& t) { return t.device(); }, tensor_); }
  std::size_t bytes() const { return static_cast<std::size_t>(shape().numel()) * dtype_size(dtype()); }
  const void* data() const { return std::visit([](const auto& t) -> const void* { return t.data(); }, tensor_); }
  void* data() { return std::visit([](auto& t) -> void* { return t.data(); }, tensor_); }
  AnyTensor to(Device device) const {
    return std::visit([&](const auto& t) { return AnyTensor(t.to(device)); }, tensor_);
  }

  template <class T> bool holds() const { return std::holds_alternative<Tensor<T>>(tensor_); }
  // The tensor as Tensor<T>; throws Error naming `op` and both dtypes when it holds another.
  template <class T> const Tensor<T>& get(std::string_view op = "AnyTensor::get") const {
    check(holds<T>(), op, "the tensor is ", dtype_name(dtype()), ", not ", dtype_name(dtype_v<T>));
    return std::get<Tensor<T>>(tensor_);
  }
  const Variant& variant() const { return tensor_; }

 private:
  Variant tensor_;
};

inline AnyTensor AnyTensor::empty(DType dtype, const Shape& shape, Device device) {
  switch (dtype) {
    case DType::f32: return Tensor<float>(shape, device);
    case DType::f64: return Tensor<double>(shape, device);
    case DType::bf16: return Tensor<bf16>(shape, device);
    case DType::f16: return Tensor<f16>(shape, device);
    case DType::i32: return Tensor<std::int32_t>(shape, device);
    case DType::i64: return Tensor<std::int64_t>(shape, device);
    case DType::f8e4m3: return Tensor<f8e4m3>(shape, device);
    case DType::f8e5m2: return Tensor<f8e5m2>(shape, device);
  }
  throw Error("AnyTensor: unknown dtype");
}

}  // namespace tapegrad
