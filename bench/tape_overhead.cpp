// (a) What recording costs per node. A chain of `chain` elementwise ops on tiny tensors, where the arithmetic is
// negligible, timed four ways: on raw Tensors (a plain loop and one allocation per op: the floor), through the Var
// API under NoGradGuard (nothing recorded), recorded on a tape (forward), and recorded then differentiated
// (forward + backward). Two ops: y·c has one input per node; y + x has two, x shared by every node (so backward
// also accumulates into x once per node). Tape teardown is untimed.
#include <memory>

#include "bench.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

constexpr int chain = 1000;

template <class T> struct Step {
  const char* name;
  Var<T> (*var)(const Var<T>& y, const Var<T>& x);
  T (*raw)(T y, T x);
};

template <class T> const Step<T> steps[] = {
    {"mul_scalar", [](const Var<T>& y, const Var<T>&) -> Var<T> { return y * 1.0001; },
     [](T y, T) { return y * T(1.0001); }},
    {"add", [](const Var<T>& y, const Var<T>& x) -> Var<T> { return y + x; }, [](T y, T x) { return y + x; }},
};

template <class T> void chains(std::int64_t numel) {
  const Shape shape{numel};
  const Tensor<T> x0 = rand_uniform<T>(shape, 7, 0.5, 1.5), seed = randn<T>(shape, 8);
  for (const Step<T>& step : steps<T>) {
    std::unique_ptr<Tape> tape;
    Var<T> x, y;
    auto record = [&] {
      tape = std::make_unique<Tape>();
      TapeScope scope(*tape);
      x = param(x0);
      y = x;
      for (int i = 0; i < chain; ++i) y = step.var(y, x);
    };
    auto teardown = [&] {
      y = Var<T>();
      x = Var<T>();
      tape.reset();
    };
    const auto timings = measure({
        {[&] {
           Tensor<T> r = x0;
           for (int i = 0; i < chain; ++i) {
             Tensor<T> next(shape);
             for (std::int64_t e = 0; e < numel; ++e) next.flat(e) = step.raw(r.flat(e), x0.flat(e));
             r = next;
           }
         }},
        {[&] {
           NoGradGuard no_grad;
           const Var<T> v = param(x0);
           Var<T> r = v;
           for (int i = 0; i < chain; ++i) r = step.var(r, v);
         }},
        {record, teardown},
        {[&] {
           record();
           backward(y, seed);
         },
         teardown},
    });
    const char* modes[] = {"raw_tensor", "no_grad", "recorded_forward", "recorded_forward_backward"};
    for (std::size_t k = 0; k < timings.size(); ++k) {
      JsonLine("tape_overhead")
          .str("op", step.name)
          .str("mode", modes[k])
          .shape(shape)
          .str("dtype", dtype_name(dtype_v<T>))
          .num("nodes", chain)
          .timing(timings[k])
          .num("ns_per_node", timings[k].median_ns / chain);
    }
  }
}

}  // namespace

void tape_overhead() {
  for (std::int64_t numel : {1, 16}) {
    chains<float>(numel);
    chains<double>(numel);
  }
}

}  // namespace bench
