#include "tapegrad/ops/fp8/amax_group.hpp"

#include <algorithm>
#include <cmath>

#include "tapegrad/tensor/factories.hpp"

namespace tapegrad::fp8 {

std::vector<float> group_max(const dist::Communicator& comm, std::span<const float> amaxes) {
  const auto count = static_cast<std::int64_t>(amaxes.size());
  const Tensor<float> all = comm.all_gather(from_vector<float>({amaxes.begin(), amaxes.end()}, {count}));
  std::vector<float> out(amaxes.begin(), amaxes.end());
  for (std::int64_t r = 0; r < comm.size(); ++r) {
    for (std::int64_t i = 0; i < count; ++i) {
      const float amax = all.flat(r * count + i);
      float& o = out[static_cast<std::size_t>(i)];
      o = std::isnan(amax) || std::isnan(o) ? NAN : std::max(o, amax);
    }
  }
  return out;
}

}  // namespace tapegrad::fp8
