// Term: an elementwise expression as a run-time tree, for the GPU. The op definitions of ops/elementwise.hpp and
// ops/activation.hpp are written against Eigen's array interface (x + y, x.exp(), x.rsqrt(), ...); Term offers
// the same interface, so that the SAME forward and backward definitions that build Eigen expressions for the CPU
// build Terms for the GPU: the chain rule is written once. A Term is compiled into a register program
// (compile_elements) that cuda/elementwise.hpp runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/elementwise.hpp"

namespace tapegrad {

class Term {
 public:
  struct Node {
    cuda::ElementOp op;
    double scalar = 0;  // constant: its value; swish: alpha
    int input = 0;      // input: which
    std::shared_ptr<const Node> a, b;
  };

  static Term input(int k) { return Term(Node{cuda::ElementOp::input, 0, k, nullptr, nullptr}); }
  static Term constant(double v) { return Term(Node{cuda::ElementOp::constant, v, 0, nullptr, nullptr}); }
  Term unary(cuda::ElementOp op, double scalar = 0) const { return Term(Node{op, scalar, 0, node_, nullptr}); }
  Term binary(cuda::ElementOp op, const Term& other) const { return Term(Node{op, 0, 0, node_, other.node_}); }

  // The part of Eigen's array interface that the op definitions use.
  Term exp() const { return unary(cuda::ElementOp::exp); }
  Term log() const { return unary(cuda::ElementOp::log); }
  Term sqrt() const { return unary(cuda::ElementOp::sqrt); }
  Term rsqrt() const { return unary(cuda::ElementOp::rsqrt); }
  Term square() const { return unary(cuda::ElementOp::square); }
  Term abs() const { return unary(cuda::ElementOp::abs); }
  Term sign() const { return unary(cuda::ElementOp::sign); }
  Term tanh() const { return unary(cuda::ElementOp::tanh); }
  Term sigmoid() const { return unary(cuda::ElementOp::sigmoid); }
  Term pow(const Term& exponent) const { return binary(cuda::ElementOp::pow, exponent); }
  // An activation functor (ops/activation.hpp's ArrayFunctor) names its GPU op.
  template <class F> Term unaryExpr(const F& f) const { return unary(f.gpu_op(), f.gpu_scalar()); }

  friend Term operator+(const Term& x, const Term& y) { return x.binary(cuda::ElementOp::add, y); }
  friend Term operator-(const Term& x, const Term& y) { return x.binary(cuda::ElementOp::sub, y); }
  friend Term operator*(const Term& x, const Term& y) { return x.binary(cuda::ElementOp::mul, y); }
  friend Term operator/(const Term& x, const Term& y) { return x.binary(cuda::ElementOp::div, y); }
  friend Term operator-(const Term& x) { return x.unary(cuda::ElementOp::neg); }

  const Node& node() const { return *node_; }

 private:
  explicit Term(Node n) : node_(std::make_shared<const Node>(std::move(n))) {}
  std::shared_ptr<const Node> node_;
};

// One result of a program: the term, which output it goes to, and whether that output is in the compute type.
struct TermOutput {
  Term term;
  int output;
  bool wide = false;
};

// The register program computing every output; throws tapegrad::Error naming `what` when the expression needs more
// registers or instructions than a program has (evaluate a part of it first).
cuda::ElementProgram compile_elements(const std::vector<TermOutput>& outputs, const std::string& what);

}  // namespace tapegrad
