// The neural-network modules in one include: Module, LayerNorm, Dense, LayerNormDense, LayerNormMLP,
// MultiHeadAttention, TransformerLayer, summary(), save / load of a module's state_dict, and data parallelism (DataParallel).
#pragma once

#include "tapegrad/ops/nn/attention.hpp"
#include "tapegrad/ops/nn/checkpoint.hpp"
#include "tapegrad/ops/nn/data_parallel.hpp"
#include "tapegrad/ops/nn/dense.hpp"
#include "tapegrad/ops/nn/layer_norm.hpp"
#include "tapegrad/ops/nn/layer_norm_dense.hpp"
#include "tapegrad/ops/nn/layer_norm_mlp.hpp"
#include "tapegrad/ops/nn/module.hpp"
#include "tapegrad/ops/nn/parameter.hpp"
#include "tapegrad/ops/nn/summary.hpp"
#include "tapegrad/ops/nn/transformer_layer.hpp"
