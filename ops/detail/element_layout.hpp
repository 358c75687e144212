// The index layout of an elementwise GPU program: where each (broadcast) input's element sits for every element of
// the output, with adjacent axes merged wherever every input walks them alike.
#pragma once

#include <string>
#include <vector>

#include "tapegrad/cuda/elementwise.hpp"
#include "tapegrad/tensor/shape.hpp"

namespace tapegrad {

// `inputs` broadcast (NumPy rules, already checked) to `output`. Throws naming `what` when there are more inputs or
// (merged) axes than a program takes.
cuda::ElementLayout element_layout(const Shape& output, const std::vector<Shape>& inputs, const std::string& what);

}  // namespace tapegrad
