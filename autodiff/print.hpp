// Printing a Var: its value as tensor/print.hpp prints a tensor, with `requires_grad=true` last when the Var requires
// a gradient (PyTorch writes `requires_grad=True` there):
//
//   tensor([1.5000, 2.0000], dtype=f32, requires_grad=true)
//
// An undefined Var prints `var(undefined)`.
#pragma once

#include <ostream>
#include <string>

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/tensor/print.hpp"

namespace tapegrad {

template <class T> std::string to_string(const Var<T>& v, const PrintOptions& options = {}) {
  if (!v.defined()) return "var(undefined)";
  return detail::tensor_to_string(v.value(), options, v.requires_grad() ? "requires_grad=true" : "");
}

template <class T> std::ostream& operator<<(std::ostream& out, const Var<T>& v) { return out << to_string(v); }

}  // namespace tapegrad
