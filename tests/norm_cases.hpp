// The norm ops that the norm tests, cpu and GPU, sweep: layernorm with and without beta, and rmsnorm.
#pragma once

#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test::norm_cases {

enum class Kind { layernorm, layernorm_no_beta, rmsnorm };
inline constexpr Kind all_kinds[] = {Kind::layernorm, Kind::layernorm_no_beta, Kind::rmsnorm};
inline const char* name(Kind k) {
  return k == Kind::layernorm ? "layernorm" : k == Kind::layernorm_no_beta ? "layernorm without beta" : "rmsnorm";
}

// The op under test; `beta` is used by Kind::layernorm only.
template <class T>
Var<T> apply(Kind kind, const Var<T>& x, const Var<T>& gamma, const Var<T>& beta, const NormOptions& options) {
  switch (kind) {
    case Kind::layernorm:
      return layernorm(x, gamma, beta, options);
    case Kind::layernorm_no_beta:
      return layernorm(x, gamma, options);
    case Kind::rmsnorm:
      return rmsnorm(x, gamma, options);
  }
  return {};
}

}  // namespace tapegrad::test::norm_cases
