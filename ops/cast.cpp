#include "tapegrad/ops/cast.hpp"

#include <string>
#include <type_traits>

#include "tapegrad/autodiff/custom_op.hpp"

namespace tapegrad {

template <class To, class From> Var<To> cast(const Var<From>& x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    struct Nothing {};
    return custom_op<Nothing>(
        "cast to " + std::string(dtype_name(dtype_v<To>)),
        [](Nothing&, const Tensor<From>& v) { return cast<To>(v); },
        [](const Nothing&, const NeedsGrad&, const Tensor<To>& dy) { return cast<From>(dy); },
        graph_backward([](const Nothing&, const NeedsGrad&, const std::tuple<Var<From>>&, const Var<To>& dy) {
          return cast<From>(dy);
        }),
        x);
  }
}

#define TAPEGRAD_INSTANTIATE_CAST_TO(To, From) template Var<To> cast<To, From>(const Var<From>&);
#define TAPEGRAD_INSTANTIATE_CAST(From)                 \
  TAPEGRAD_INSTANTIATE_CAST_TO(float, From)             \
  TAPEGRAD_INSTANTIATE_CAST_TO(double, From)            \
  TAPEGRAD_INSTANTIATE_CAST_TO(::tapegrad::bf16, From)  \
  TAPEGRAD_INSTANTIATE_CAST_TO(::tapegrad::f16, From)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_CAST)

}  // namespace tapegrad
