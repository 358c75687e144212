// What Module::load_state_dict and Optimizer::load_state_dict throw when a dict does not fit: every problem at once.
// Internal: included by ops/nn/module.cpp and ops/optim/optimizer.cpp only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::nn::detail {

// Throws "<owner>: load_state_dict: N problems; <each>; nothing was loaded".
[[noreturn]] inline void throw_load_problems(std::string_view owner, const std::vector<std::string>& problems) {
  std::string message = std::string(owner) + ": load_state_dict: " + std::to_string(problems.size()) +
                        (problems.size() == 1 ? " problem" : " problems");
  for (const std::string& problem : problems) message += "; " + problem;
  throw Error(message + "; nothing was loaded");
}

}  // namespace tapegrad::nn::detail
