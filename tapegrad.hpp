// The whole public API of tapegrad in one include.
#pragma once

#include "autodiff/custom_op.hpp"
#include "autodiff/gradcheck.hpp"
#include "autodiff/tape.hpp"
#include "autodiff/var.hpp"
#include "ops/activation.hpp"
#include "ops/elementwise.hpp"
#include "ops/layout.hpp"
#include "ops/loss.hpp"
#include "ops/matmul.hpp"
#include "ops/nn/nn.hpp"
#include "ops/norm.hpp"
#include "ops/reduce.hpp"
#include "ops/softmax.hpp"
#include "tensor/factories.hpp"
#include "tensor/initializers.hpp"
#include "tensor/tensor.hpp"
