#include "tapegrad/tensor/accumulate.hpp"

#include <utility>

#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/add.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

template <class T> Tensor<T> sum_of(const Tensor<T>& a, const Tensor<T>& b) {
  check_defined(a, "accumulate", "the sum");
  check_defined(b, "accumulate", "the addend");
  check(a.shape() == b.shape() && a.device() == b.device(), "accumulate", "cannot add a tensor of shape ", b.shape(),
        " on ", b.device(), " to one of shape ", a.shape(), " on ", a.device());
  Tensor<T> total(a.shape(), a.device());
  by_device(
      "accumulate", a.device(),
      [&] {
        auto out = flat_view(total);
        auto x = flat_view(a);
        auto y = flat_view(b);
        run_on_cpu(total.numel(), [&](auto& device) { out.device(device) = x + y; });
      },
      [&](auto gpu) { cuda::add(dtype_v<T>, a.data(), b.data(), total.data(), total.numel(), gpu.index); });
  return total;
}

#define TAPEGRAD_INSTANTIATE_SUM_OF(T) template Tensor<T> sum_of<T>(const Tensor<T>&, const Tensor<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_SUM_OF)

}  // namespace tapegrad
