// Term: an elementwise expression as a run-time tree, for the GPU. The op definitions of ops/elementwise.hpp and
// ops/activation.hpp are written against Eigen's array interface (x + y, x.exp(), x.rsqrt(), ...); Term offers
// the same interface, so that the SAME forward and backward definitions that build Eigen expressions for the CPU
// build Terms for the GPU: the chain rule is written once. run_terms compiles Terms into a register program and runs
// it (cuda/elementwise.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tapegrad/cuda/detail/element_op.hpp"
#include "tapegrad/tensor/core/device.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/tensor/shape.hpp"

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

// Computes every term over the index space `output` on GPU `device`, elements of `dtype`: input k is inputs[k], of
// shape input_shapes[k] broadcast to `output`; term j's result goes to outputs[terms[j].output], of `output`'s size,
// in `dtype` (or its compute type where wide). One launch. Throws tapegrad::Error naming `what` when the terms need
// more registers, instructions, inputs or axes than a program has (evaluate a part of the expression first).
void run_terms(DType dtype, Device device, const std::vector<TermOutput>& terms, const Shape& output,
               const std::vector<Shape>& input_shapes, const std::vector<const void*>& inputs,
               const std::vector<void*>& outputs, const std::string& what);

}  // namespace tapegrad
