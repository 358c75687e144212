#include "tapegrad/ops/optim/sgd.hpp"

#include <utility>

namespace tapegrad::optim {

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

template <class S> SGDRule<S> SGD::rule(std::int64_t t) const {
  return {.lr = static_cast<S>(options_.lr),
          .momentum = static_cast<S>(options_.momentum),
          .damped = static_cast<S>(1 - options_.dampening),
          .weight_decay = static_cast<S>(options_.weight_decay),
          .use_momentum = options_.momentum != 0,
          .nesterov = options_.nesterov,
          .first = t == 1};
}

void SGD::update(UpdateTarget& target, std::int64_t t) const { target.apply(rule<float>(t), rule<double>(t)); }

}  // namespace tapegrad::optim
