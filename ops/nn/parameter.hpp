// A parameter of any floating dtype, named by its path in a model ("block0.mlp.w1"): what modules report, what
// summary() lists and what optimizers update. A Var is a handle, so updating `var`'s value updates the module's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad::nn {

using AnyVar = std::variant<Var<float>, Var<double>, Var<bf16>, Var<f16>>;

// A parameter of a tensor-parallel module is rank `rank`'s block of `ranks` equal blocks of the whole along `axis`.
struct ParameterShard {
  int axis = 0;
  int rank = 0;
  int ranks = 1;
};

struct NamedParameter {
  std::string path;
  AnyVar var;
  std::optional<ParameterShard> shard{};  // none: the whole parameter (or one replicated over the ranks)

  DType dtype() const {
    return std::visit([](const auto& v) { return v.dtype(); }, var);
  }
  const Shape& shape() const {
    return std::visit([](const auto& v) -> const Shape& { return v.shape(); }, var);
  }
  Device device() const {
    return std::visit([](const auto& v) { return v.device(); }, var);
  }
  std::int64_t numel() const { return shape().numel(); }
  std::int64_t bytes() const { return numel() * static_cast<std::int64_t>(dtype_size(dtype())); }
};

using ParameterList = std::vector<NamedParameter>;

}  // namespace tapegrad::nn
