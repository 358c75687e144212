#include "ops/optim/adam.hpp"

#include <cmath>
#include <utility>

namespace tapegrad::optim {

namespace {

template <class S>
void adam_update(const AdamOptions& options, bool decoupled, const Chunk<S>& chunk, std::int64_t t) {
  // The bias corrections and the decay factor in f64, then rounded to S, as PyTorch computes them in Python floats.
  const double steps = static_cast<double>(t);
  const S beta1 = static_cast<S>(options.beta1), beta2 = static_cast<S>(options.beta2),
          eps = static_cast<S>(options.eps), weight_decay = static_cast<S>(options.weight_decay),
          decay = static_cast<S>(1 - options.lr * options.weight_decay),
          step_size = static_cast<S>(options.lr / (1 - std::pow(options.beta1, steps))),
          bias_correction2_sqrt = static_cast<S>(std::sqrt(1 - std::pow(options.beta2, steps)));
  for (std::int64_t i = 0; i < chunk.size; ++i) {
    S& p = chunk.param[i];
    S& m = chunk.state[0][i];
    S& v = chunk.state[1][i];
    S g = chunk.grad[i];
    if (decoupled) {
      p *= decay;
    } else {
      g += weight_decay * p;
    }
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    p -= step_size * m / (std::sqrt(v) / bias_correction2_sqrt + eps);
  }
}

template <double D> AdamOptions plain(const AdamHyperparameters<D>& o) {
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
}

}  // namespace

Adam::Adam(nn::ParameterList parameters, AdamOptions options)
    : Adam("Adam", std::move(parameters), options, false) {}

Adam::Adam(std::string name, nn::ParameterList parameters, AdamOptions options, bool decoupled_weight_decay)
    : Optimizer(std::move(name), std::move(parameters), 2), options_(options), decoupled_(decoupled_weight_decay) {
  require(options.lr >= 0, "lr", ">= 0", options.lr);
  require(options.beta1 >= 0 && options.beta1 < 1, "beta1", "in [0, 1)", options.beta1);
  require(options.beta2 >= 0 && options.beta2 < 1, "beta2", "in [0, 1)", options.beta2);
  require(options.eps > 0, "eps", "> 0", options.eps);
  require(options.weight_decay >= 0, "weight_decay", ">= 0", options.weight_decay);
}

void Adam::update(const Chunk<float>& chunk, std::int64_t t) const { adam_update(options_, decoupled_, chunk, t); }
void Adam::update(const Chunk<double>& chunk, std::int64_t t) const { adam_update(options_, decoupled_, chunk, t); }

AdamW::AdamW(nn::ParameterList parameters, AdamWOptions options)
    : Adam("AdamW", std::move(parameters), plain(options), true) {}

}  // namespace tapegrad::optim
