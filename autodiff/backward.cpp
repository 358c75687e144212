// The passes: backward (gradients into .grad) and grad (gradients handed back), and the second-order products made of
// them (hvp, jvp). Both seed their outputs and run one
// reverse pass over the outputs' tape; with create_graph that tape is active during the pass, so that what the
// nodes record lands beside the graph it differentiates.
#include <string>
#include <vector>

#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/autodiff/higher_order.hpp"
#include "tapegrad/tensor/factories.hpp"

namespace tapegrad {

namespace {

template <class T> void check_output(const char* op, const Var<T>& y, const Var<T>& seed, std::size_t k) {
  const std::string which = k == 0 ? "the output" : detail::concat("output ", k);
  if (!y.defined()) detail::throw_undefined_var(op, which);
  if (!seed.defined()) detail::throw_undefined_var(op, "the seed gradient of " + which);
  const VarSlot& slot = *y.slot();
  if (!slot.requires_grad) {
    throw AutodiffError(detail::concat(op, ": ", which, " of shape ", y.shape(),
                                       " does not require grad (no input that requires grad was used to compute it; "
                                       "a gradient made without create_graph, or under a NoGradGuard, is a constant)"));
  }
  if (slot.is_stale()) {
    throw AutodiffError(detail::concat(op, ": ", which, " of shape ", y.shape(),
                                       " was recorded on a tape that has since been cleared"));
  }
  if (!(seed.shape() == y.shape())) {
    throw AutodiffError(detail::concat(op, ": the seed gradient has shape ", seed.shape(), " but ", which,
                                       " has shape ", y.shape()));
  }
  if (!(seed.device() == y.device())) {
    throw AutodiffError(detail::concat(op, ": the seed gradient is on ", seed.device(), " but ", which, " is on ",
                                       y.device()));
  }
}

// A seed of ones for an output of one element; throws naming `op` for others.
template <class T> Var<T> unit_seed(const char* op, const Var<T>& y) {
  if (!y.defined()) detail::throw_undefined_var(op, "the output");
  if (y.numel() != 1) {
    throw AutodiffError(detail::concat(op, ": output of shape ", y.shape(),
                                       " is not a scalar; pass a seed gradient of that shape"));
  }
  return constant(ones<T>(y.shape(), y.device()));
}

// Seeds outputs[k] with seeds[k] and runs the reverse pass over their tape.
template <class T>
void run_pass(const char* op, const std::vector<Var<T>>& outputs, const std::vector<Var<T>>& seeds,
              const BackwardOptions& options, std::size_t floor = 0) {
  for (std::size_t k = 0; k < outputs.size(); ++k) check_output(op, outputs[k], seeds[k], k);
  if (options.create_graph && !grad_enabled()) {
    throw AutodiffError(detail::concat(op, ": create_graph records the backward, but recording is off here (a "
                                       "NoGradGuard is alive); leave its scope first"));
  }
  const auto seed = [&](std::size_t k) {
    VarImpl<T>& slot = *outputs[k].slot();
    if (options.create_graph) {
      slot.accumulate(seeds[k].slot(), "backward (seed gradient)");
    } else {
      slot.accumulate(seeds[k].value(), "backward (seed gradient)");
    }
  };
  std::vector<VarSlot*> roots;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k].is_leaf()) {
      seed(k);  // nothing to run: the seed is the leaf's gradient
    } else {
      roots.push_back(outputs[k].slot().get());
    }
  }
  if (roots.empty()) return;
  const TapeUse use(*roots.front(), op);  // before the seeds: a refused pass leaves nothing behind
  std::optional<TapeScope> recording;
  if (options.create_graph) recording.emplace(use.tape());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].is_leaf()) seed(k);
  }
  use.tape().backward(roots, options, floor);
}

}  // namespace

template <class T> void backward(const Var<T>& y, const Tensor<T>& dy, BackwardOptions options) {
  check_defined(dy, "backward", "the seed gradient");
  run_pass<T>("backward", {y}, {constant(dy)}, options);
}

template <class T> void backward(const Var<T>& y, BackwardOptions options) {
  run_pass<T>("backward", {y}, {unit_seed("backward", y)}, options);
}

namespace {

// grad's work, over the nodes from `floor` up (composite_vjp's nested pass: see Tape::backward).
template <class T>
std::vector<Var<T>> gradients(const std::vector<Var<T>>& outputs, const std::vector<Var<T>>& inputs,
                              const GradOptions<T>& options, std::size_t floor) {
  constexpr const char* op = "grad";
  if (outputs.empty()) throw AutodiffError("grad: no outputs to differentiate");
  std::vector<Var<T>> seeds = options.seeds;
  if (seeds.empty()) {
    for (const Var<T>& y : outputs) seeds.push_back(unit_seed(op, y));
  } else if (seeds.size() != outputs.size()) {
    throw AutodiffError(detail::concat("grad: ", seeds.size(), " seeds for ", outputs.size(), " outputs"));
  }
  // Each input's gradient collects in a leaf of its own, the inputs' .grad untouched.
  std::vector<std::shared_ptr<VarImpl<T>>> sinks;
  detail::GradCapture capture;
  capture.floor = floor;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) detail::throw_undefined_var(op, detail::concat("input ", i));
    if (!inputs[i].requires_grad()) {
      throw AutodiffError(detail::concat("grad: input ", i, " of shape ", inputs[i].shape(),
                                         " does not require grad, so no gradient flows to it"));
    }
    sinks.push_back(std::make_shared<VarImpl<T>>(Tensor<T>()));
    capture.sinks.emplace_back(inputs[i].slot().get(), sinks.back().get());
  }
  struct Capturing {
    explicit Capturing(detail::GradCapture* c) : previous(std::exchange(detail::grad_capture(), c)) {}
    ~Capturing() { detail::grad_capture() = previous; }
    detail::GradCapture* previous;
  };
  {
    const Capturing capturing(&capture);
    run_pass(op, outputs, seeds,
             {.retain_graph = options.retain_graph.value_or(options.create_graph),
              .create_graph = options.create_graph},
             floor);
  }
  std::vector<Var<T>> out;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const VarImpl<T>& sink = *sinks[i];
    if (!sink.grad.defined()) {
      if (!options.allow_unused) {
        throw AutodiffError(detail::concat("grad: input ", i, " of shape ", inputs[i].shape(),
                                           " was not used to compute the outputs; pass allow_unused = true to get "
                                           "an undefined Var for it"));
      }
      out.emplace_back();
    } else if (sink.grad_graph) {
      out.push_back(Var<T>::from_slot(sink.grad_graph));
    } else {
      out.push_back(constant(sink.grad));
    }
  }
  return out;
}

}  // namespace

template <class T>
std::vector<Var<T>> grad(const std::vector<Var<T>>& outputs, const std::vector<Var<T>>& inputs,
                         const GradOptions<T>& options) {
  return gradients(outputs, inputs, options, 0);
}

template <class T>
std::vector<Var<T>> composite_vjp(const DifferentiableFunction<T>& composite, const std::vector<Var<T>>& inputs,
                                  const Var<T>& dy) {
  const std::size_t floor = Tape::active().size();
  const Var<T> y = composite(inputs);
  if (!y.requires_grad()) return std::vector<Var<T>>(inputs.size());
  std::vector<Var<T>> wanted;  // the inputs a gradient can reach
  for (const Var<T>& x : inputs) {
    if (x.requires_grad()) wanted.push_back(x);
  }
  const std::vector<Var<T>> g =
      gradients<T>({y}, wanted, {.seeds = {dy}, .create_graph = true, .allow_unused = true}, floor);
  std::vector<Var<T>> out;
  std::size_t next = 0;
  for (const Var<T>& x : inputs) out.push_back(x.requires_grad() ? g[next++] : Var<T>());
  return out;
}

namespace {
template <class T>
void check_directions(const char* op, const std::vector<Tensor<T>>& x, const std::vector<Tensor<T>>& directions) {
  if (x.empty()) throw AutodiffError(detail::concat(op, ": no inputs given"));
  if (directions.size() != x.size()) {
    throw AutodiffError(detail::concat(op, ": ", directions.size(), " directions for ", x.size(), " inputs"));
  }
  for (std::size_t k = 0; k < x.size(); ++k) {
    check_defined(x[k], op, detail::concat("input ", k));
    check_defined(directions[k], op, detail::concat("direction ", k));
    if (!(directions[k].shape() == x[k].shape()) || !(directions[k].device() == x[k].device())) {
      throw AutodiffError(detail::concat(op, ": direction ", k, " has shape ", directions[k].shape(), " on ",
                                         directions[k].device(), " but input ", k, " has shape ", x[k].shape(),
                                         " on ", x[k].device()));
    }
  }
}

// The inputs as parameters, and f of them, on `tape`.
template <class T>
std::pair<std::vector<Var<T>>, Var<T>> record(Tape& tape, const DifferentiableFunction<T>& f,
                                              const std::vector<Tensor<T>>& x) {
  const TapeScope scope(tape);
  std::vector<Var<T>> in;
  for (const Tensor<T>& t : x) in.push_back(param(t));
  return {in, f(in)};
}

template <class T> std::vector<Var<T>> constants(const std::vector<Tensor<T>>& tensors) {
  std::vector<Var<T>> out;
  for (const Tensor<T>& t : tensors) out.push_back(constant(t));
  return out;
}

template <class T> std::vector<Tensor<T>> values_or_zeros(const std::vector<Var<T>>& g, const std::vector<Tensor<T>>& x) {
  std::vector<Tensor<T>> out;
  for (std::size_t k = 0; k < g.size(); ++k) {
    out.push_back(g[k].defined() ? g[k].value() : zeros<T>(x[k].shape(), x[k].device()));
  }
  return out;
}
}  // namespace

template <class T>
std::vector<Tensor<T>> hvp(const DifferentiableFunction<T>& f, const std::vector<Tensor<T>>& x,
                           const std::vector<Tensor<T>>& v) {
  check_directions("hvp", x, v);
  Tape tape;
  const auto [in, y] = record(tape, f, x);
  const TapeScope scope(tape);
  const std::vector<Var<T>> g = grad({y}, in, {.create_graph = true, .allow_unused = true});
  std::vector<Var<T>> outputs, seeds;
  for (std::size_t k = 0; k < g.size(); ++k) {
    if (g[k].defined() && g[k].requires_grad()) {
      outputs.push_back(g[k]);
      seeds.push_back(constant(v[k]));
    }
  }
  if (outputs.empty()) return values_or_zeros<T>(std::vector<Var<T>>(x.size()), x);  // f is linear in x
  return values_or_zeros(grad(outputs, in, {.seeds = seeds, .allow_unused = true}), x);
}

template <class T>
Tensor<T> jvp(const DifferentiableFunction<T>& f, const std::vector<Tensor<T>>& x, const std::vector<Tensor<T>>& u) {
  check_directions("jvp", x, u);
  Tape tape;
  const auto [in, y] = record(tape, f, x);
  const TapeScope scope(tape);
  const Var<T> w = param(zeros<T>(y.shape(), y.device()));  // g(w) = Jᵀw is linear in w
  const std::vector<Var<T>> g = grad({y}, in, {.seeds = {w}, .create_graph = true, .allow_unused = true});
  std::vector<Var<T>> outputs, seeds;
  for (std::size_t k = 0; k < g.size(); ++k) {
    if (g[k].defined()) {
      outputs.push_back(g[k]);
      seeds.push_back(constant(u[k]));
    }
  }
  if (outputs.empty()) return zeros<T>(y.shape(), y.device());
  const std::vector<Var<T>> ju = grad(outputs, {w}, {.seeds = seeds, .allow_unused = true});
  return ju[0].defined() ? ju[0].value() : zeros<T>(y.shape(), y.device());
}

#define TAPEGRAD_INSTANTIATE_PASSES(T)                                                       \
  template void backward<T>(const Var<T>&, BackwardOptions);                                 \
  template void backward<T>(const Var<T>&, const Tensor<T>&, BackwardOptions);               \
  template std::vector<Var<T>> grad<T>(const std::vector<Var<T>>&, const std::vector<Var<T>>&, \
                                       const GradOptions<T>&);                                  \
  template std::vector<Var<T>> composite_vjp<T>(const DifferentiableFunction<T>&, const std::vector<Var<T>>&,  \
                                                const Var<T>&);                                               \
  template std::vector<Tensor<T>> hvp<T>(const DifferentiableFunction<T>&, const std::vector<Tensor<T>>&, \
                                         const std::vector<Tensor<T>>&);                                 \
  template Tensor<T> jvp<T>(const DifferentiableFunction<T>&, const std::vector<Tensor<T>>&,              \
                            const std::vector<Tensor<T>>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_PASSES)

}  // namespace tapegrad
