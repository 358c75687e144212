// The neural-network modules in one include: Module, LayerNorm, Dense, LayerNormDense, LayerNormMLP,
// MultiHeadAttention and summary().
#pragma once

#include "ops/nn/attention.hpp"
#include "ops/nn/dense.hpp"
#include "ops/nn/layer_norm.hpp"
#include "ops/nn/layer_norm_dense.hpp"
#include "ops/nn/layer_norm_mlp.hpp"
#include "ops/nn/module.hpp"
#include "ops/nn/parameter.hpp"
#include "ops/nn/summary.hpp"
