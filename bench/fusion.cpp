// (b) One fused node against one node per op, on 1M-element f32 tensors. The fused form is the plain expression
// (`Var y = a * b + exp(c)`): one loop forward, and backward one loop per input gradient, nothing saved. The
// op-by-op form assigns every op to its own Var, so each op is a node, a loop and a saved 4 MB intermediate.
// Timed without a tape (NoGradGuard), recorded, and recorded + backward; and the bytes the forward leaves held
// (the output plus what the tape saves), as the allocator counts them.
#include <memory>

#include "bench.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;
using F = Var<float> (*)(const Var<float>&, const Var<float>&, const Var<float>&);

struct Form {
  const char* expression;
  const char* form;
  F f;
};

const Form forms[] = {
    {"a*b+exp(c)", "fused",
     [](const Var<float>& a, const Var<float>& b, const Var<float>& c) -> Var<float> { return a * b + exp(c); }},
    {"a*b+exp(c)", "op_by_op",
     [](const Var<float>& a, const Var<float>& b, const Var<float>& c) -> Var<float> {
       const Var<float> ab = a * b, ec = exp(c);
       return ab + ec;
     }},
    {"sigmoid(a)*tanh(b)+c*c", "fused",
     [](const Var<float>& a, const Var<float>& b, const Var<float>& c) -> Var<float> {
       return sigmoid(a) * tanh(b) + c * c;
     }},
    {"sigmoid(a)*tanh(b)+c*c", "op_by_op",
     [](const Var<float>& a, const Var<float>& b, const Var<float>& c) -> Var<float> {
       const Var<float> sa = sigmoid(a), tb = tanh(b), st = sa * tb, cc = c * c;
       return st + cc;
     }},
    {"gelu_tanh(a)*silu(b)+c", "fused",
     [](const Var<float>& a, const Var<float>& b, const Var<float>& c) -> Var<float> {
       return gelu_tanh(a) * silu(b) + c;
     }},
    {"gelu_tanh(a)*silu(b)+c", "op_by_op",
     [](const Var<float>& a, const Var<float>& b, const Var<float>& c) -> Var<float> {
       const Var<float> ga = gelu_tanh(a), sb = silu(b), gs = ga * sb;
       return gs + c;
     }},
};

}  // namespace

void fusion() {
  const Shape shape{1 << 20};
  Var<float> a = param(randn<float>(shape, 11)), b = param(randn<float>(shape, 12)), c = param(randn<float>(shape, 13));
  const Tensor<float> seed = randn<float>(shape, 14);
  const double output_bytes = static_cast<double>(shape.numel()) * sizeof(float);
  for (const Form& form : forms) {
    std::unique_ptr<Tape> tape;
    Var<float> y;
    auto forward = [&] {
      tape = std::make_unique<Tape>();
      TapeScope scope(*tape);
      y = form.f(a, b, c);
    };
    auto teardown = [&] {
      y = Var<float>();
      tape.reset();
      zero_grad(a, b, c);
    };
    const auto timings = measure({
        {[&] {
           NoGradGuard no_grad;
           form.f(a, b, c);
         }},
        {forward, teardown},
        {[&] {
           forward();
           backward(y, seed);
         },
         teardown},
    });
    const char* modes[] = {"no_grad", "recorded_forward", "recorded_forward_backward"};
    for (std::size_t k = 0; k < timings.size(); ++k) {
      JsonLine("fusion")
          .str("expression", form.expression)
          .str("form", form.form)
          .str("mode", modes[k])
          .shape(shape)
          .str("dtype", "f32")
          .timing(timings[k])
          .num("ns_per_element", timings[k].median_ns / static_cast<double>(shape.numel()));
    }

    // Memory, once: what the forward leaves allocated, and what is left after backward (the inputs' gradients).
    const std::int64_t before = allocated_bytes();
    forward();
    const double after_forward = static_cast<double>(allocated_bytes() - before);
    backward(y, seed);
    const double after_backward = static_cast<double>(allocated_bytes() - before);
    teardown();
    JsonLine("fusion_memory")
        .str("expression", form.expression)
        .str("form", form.form)
        .shape(shape)
        .str("dtype", "f32")
        .num("held_after_forward_bytes", after_forward)
        .num("saved_beyond_output_bytes", after_forward - output_bytes)
        .num("held_after_backward_bytes", after_backward);
  }
}

}  // namespace bench
