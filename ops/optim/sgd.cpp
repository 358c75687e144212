#include "tapegrad/ops/optim/sgd.hpp"

#include <utility>

namespace tapegrad::optim {

SGD::SGD(nn::ParameterList parameters, SGDOptions options)
    : Optimizer("SGD", std::move(parameters), options.momentum != 0 ? 1 : 0), options_(options) {
  check_options(options);
}

void SGD::check_options(const SGDOptions& options) const {
  require(options.lr >= 0, "lr", ">= 0", options.lr);
  require(options.momentum >= 0, "momentum", ">= 0", options.momentum);
  require(options.dampening >= 0 && options.dampening <= 1, "dampening", "in [0, 1]", options.dampening);
  require(options.weight_decay >= 0, "weight_decay", ">= 0", options.weight_decay);
  if (options.nesterov) {
    require(options.momentum > 0, "momentum", "> 0 with nesterov", options.momentum);
    require(options.dampening == 0, "dampening", "0 with nesterov", options.dampening);
  }
}

std::vector<std::string> SGD::buffer_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

std::vector<std::pair<std::string, double>> SGD::hyperparameters() const {
  return {{"lr", options_.lr},
          {"momentum", options_.momentum},
          {"dampening", options_.dampening},
          {"weight_decay", options_.weight_decay},
          {"nesterov", options_.nesterov ? 1.0 : 0.0}};
}

void SGD::set_hyperparameters(const std::map<std::string, double, std::less<>>& values) {
  const SGDOptions options{.lr = values.at("lr"),
                           .momentum = values.at("momentum"),
                           .dampening = values.at("dampening"),
                           .weight_decay = values.at("weight_decay"),
                           .nesterov = values.at("nesterov") != 0};
  check_options(options);
  // Momentum decides whether the rule keeps a buffer, which the optimizer fixed when it was made.
  require((options.momentum != 0) == (options_.momentum != 0), "momentum",
          options_.momentum != 0 ? "non-zero, as this optimizer was made with" : "0, as this optimizer was made with",
          options.momentum);
  options_ = options;
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
