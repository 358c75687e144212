// The library's exception types. Every error a user can cause throws one of these, with a message that names the
// op and the offending shapes, dtypes or devices.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tapegrad {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Misuse of the tape: backward twice, a cleared tape, a wrong seed.
class AutodiffError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Parts> std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

// Throws Error("op: <parts...>") when `ok` is false. Parts are only formatted on failure.
template <class... Parts> inline void check(bool ok, std::string_view op, Parts&&... parts) {
  if (!ok) throw Error(detail::concat(op, ": ", std::forward<Parts>(parts)...));
}

}  // namespace tapegrad
