// Builds the ProjectAttend model of issue 3 (bf16 parameters, 8 heads of 128) and prints its summary on a bf16
// input [8, 16, 128].
#include <iostream>

#include "project_attend.hpp"

using namespace tapegrad;

int main() {
  examples::ProjectAttend<bf16> model(128, {.num_heads = 8, .head_dim = 128, .causal = true}, /*seed=*/0);
  const Tensor<bf16> x = randn<bf16>({8, 16, 128}, /*seed=*/1);
  std::cout << nn::summary(model, x);
}
