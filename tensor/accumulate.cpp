#include "tapegrad/tensor/detail/accumulate.hpp"

#include <utility>

#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/detail/add.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

template <class T> void add_to(Tensor<T>& total, const Tensor<T>& g) {
  check_defined(g, "accumulate", "the addend");
  if (!total.defined()) {
    total = g;
    return;
  }
  check(total.shape() == g.shape() && total.device() == g.device(), "accumulate", "cannot add a tensor of shape ",
        g.shape(), " on ", g.device(), " to one of shape ", total.shape(), " on ", total.device());
  Tensor<T> sum = total.owns_storage_alone() ? total : Tensor<T>(total.shape(), total.device());
  by_device(
      "accumulate", total.device(),
      [&] {
        auto out = flat_view(sum);
        auto x = flat_view(std::as_const(total));
        auto y = flat_view(g);
        run_on_cpu(sum.numel(), [&](auto& device) { out.device(device) = x + y; });
      },
      [&](auto gpu) { cuda::add(dtype_v<T>, total.data(), g.data(), sum.data(), sum.numel(), gpu.index); });
  total = std::move(sum);
}

#define TAPEGRAD_INSTANTIATE_ADD_TO(T) template void add_to<T>(Tensor<T>&, const Tensor<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_ADD_TO)

}  // namespace tapegrad
