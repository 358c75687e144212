// The op running on this thread, named by the errors that shared code raises on its behalf: a shape whose element
// count overflows, a tensor too large to address, memory that cannot be allocated. custom_op and elementwise
// expressions run every op built on them through run_op (backward passes run each node so); an op that forms shapes
// before it records opens a scope at its entry, so that "matmul: ..." names matmul rather than the tensor it could
// not make.
#pragma once

#include <new>
#include <stdexcept>
#include <string_view>

namespace tapegrad {

class OpScope {
 public:
  // `op` must outlive the scope (a literal, or a node's name).
  explicit OpScope(std::string_view op) noexcept;
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  std::string_view previous_;
};

// The innermost op in scope on this thread; `outside` when none is.
std::string_view current_op(std::string_view outside);

namespace detail {
// OutOfMemoryError on the cpu naming `op`, for an allocation of unknown size (a std::bad_alloc).
[[noreturn]] void throw_host_out_of_memory(std::string_view op);
// Error naming `op` for a container that would exceed its maximum size (a std::length_error).
[[noreturn]] void throw_too_long(std::string_view op, const std::length_error& error);
}  // namespace detail

// Runs `body` as the op `op`: in its scope, with the standard library's allocation failures turned into tapegrad's
// own errors, so that none escapes an op as a std::bad_alloc.
template <class Body> decltype(auto) run_op(std::string_view op, Body&& body) {
  const OpScope scope(op);
  try {
    return body();
  } catch (const std::bad_alloc&) {
    detail::throw_host_out_of_memory(op);
  } catch (const std::length_error& error) {
    detail::throw_too_long(op, error);
  }
}

}  // namespace tapegrad
