// The two dtypes of a module: P, the dtype its parameters are stored in, and C, the dtype it computes and returns
// in. C = void computes in the input's dtype (flax's dtype=None). `Dense<f32, bf16>` keeps f32 parameters (their
// gradients arrive in f32) and runs in bf16; `Dense<bf16>` stores bf16 parameters and follows its input.
#pragma once

#include <type_traits>

#include "tapegrad/tensor/dtype.hpp"

namespace tapegrad::nn {

// The compute dtype of a module with compute dtype C called on an input of dtype T.
template <class C, class T> using compute_of = std::conditional_t<std::is_void_v<C>, T, C>;

template <class P, class C>
concept ModuleDtypes = is_float_dtype_v<P> && (std::is_void_v<C> || is_float_dtype_v<C>);

}  // namespace tapegrad::nn
