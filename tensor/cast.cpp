#include <cstdint>

#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/detail/cast.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

template <class To, class From> Tensor<To> converted(const Tensor<From>& t) {
  check_defined(t, "cast");
  return by_device(
      "cast", t.device(),
      [&] {
        Tensor<To> out(t.shape());
        const From* src = t.data();
        To* dst = out.data();
        parallel_for(t.numel(), 4, [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i) dst[i] = convert<To>(src[i]);
        });
        return out;
      },
      [&](auto gpu) -> Tensor<To> {
        if constexpr ((is_float_dtype_v<To> || is_fp8_v<To>) && (is_float_dtype_v<From> || is_fp8_v<From>)) {
          Tensor<To> out(t.shape(), gpu);
          cuda::cast(dtype_v<From>, t.data(), dtype_v<To>, out.data(), t.numel(), gpu.index);
          return out;
        } else {
          throw_cpu_only("cast", 0, gpu);  // the integer dtypes live on the cpu
        }
      });
}

// Every pair of dtypes.
#define TAPEGRAD_FOR_EACH_DTYPE(MACRO, FROM) \
  MACRO(float, FROM)                         \
  MACRO(double, FROM)                        \
  MACRO(bf16, FROM)                          \
  MACRO(f16, FROM)                           \
  MACRO(f8e4m3, FROM)                        \
  MACRO(f8e5m2, FROM)                        \
  MACRO(std::int32_t, FROM)                  \
  MACRO(std::int64_t, FROM)
#define TAPEGRAD_INSTANTIATE_CONVERTED(TO, FROM) \
  template Tensor<TO> converted<TO, FROM>(const Tensor<FROM>&);
#define TAPEGRAD_INSTANTIATE_FROM(FROM) TAPEGRAD_FOR_EACH_DTYPE(TAPEGRAD_INSTANTIATE_CONVERTED, FROM)
TAPEGRAD_INSTANTIATE_FROM(float)
TAPEGRAD_INSTANTIATE_FROM(double)
TAPEGRAD_INSTANTIATE_FROM(bf16)
TAPEGRAD_INSTANTIATE_FROM(f16)
TAPEGRAD_INSTANTIATE_FROM(f8e4m3)
TAPEGRAD_INSTANTIATE_FROM(f8e5m2)
TAPEGRAD_INSTANTIATE_FROM(std::int32_t)
TAPEGRAD_INSTANTIATE_FROM(std::int64_t)

}  // namespace tapegrad::detail
