#include "ops/optim/sgd.hpp"

#include <utility>

namespace tapegrad::optim {

namespace {

template <class S> void sgd_update(const SGDOptions& options, const Chunk<S>& chunk, std::int64_t t) {
  const S lr = static_cast<S>(options.lr), momentum = static_cast<S>(options.momentum),
          damped = static_cast<S>(1 - options.dampening), weight_decay = static_cast<S>(options.weight_decay);
  for (std::int64_t i = 0; i < chunk.size; ++i) {
    S& p = chunk.param[i];
    S g = chunk.grad[i] + weight_decay * p;
    if (options.momentum != 0) {
      S& b = chunk.state[0][i];
      b = t == 1 ? g : momentum * b + damped * g;
      g = options.nesterov ? g + momentum * b : b;
    }
    p -= lr * g;
  }
}

}  // namespace

SGD::SGD(nn::ParameterList parameters, SGDOptions options)
    : Optimizer("SGD", std::move(parameters), options.momentum != 0 ? 1 : 0), options_(options) {
  require(options.lr >= 0, "lr", ">= 0", options.lr);
  require(options.momentum >= 0, "momentum", ">= 0", options.momentum);
  require(options.dampening >= 0 && options.dampening <= 1, "dampening", "in [0, 1]", options.dampening);
  require(options.weight_decay >= 0, "weight_decay", ">= 0", options.weight_decay);
  if (options.nesterov) {
    require(options.momentum > 0, "momentum", "> 0 with nesterov", options.momentum);
    require(options.dampening == 0, "dampening", "0 with nesterov", options.dampening);
  }
}

void SGD::update(const Chunk<float>& chunk, std::int64_t t) const { sgd_update(options_, chunk, t); }
void SGD::update(const Chunk<double>& chunk, std::int64_t t) const { sgd_update(options_, chunk, t); }

}  // namespace tapegrad::optim
