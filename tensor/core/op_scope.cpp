#include "tapegrad/tensor/core/detail/op_scope.hpp"

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad {

namespace {
// Set by every op: initial-exec, one load instead of the dynamic linker's lookup per access (tensor/small_blocks.cpp).
[[gnu::tls_model("initial-exec")]] thread_local std::string_view innermost_op;
}  // namespace

OpScope::OpScope(std::string_view op) noexcept : previous_(innermost_op) { innermost_op = op; }
OpScope::~OpScope() { innermost_op = previous_; }

std::string_view current_op(std::string_view outside) { return innermost_op.empty() ? outside : innermost_op; }

namespace detail {
void throw_too_long(std::string_view op, const std::length_error& error) {
  throw Error(concat(op, ": a buffer would exceed its largest possible size (", error.what(), ")"));
}
}  // namespace detail

}  // namespace tapegrad
