#include "tapegrad/ops/optim/adam.hpp"

#include <cmath>
#include <utility>

namespace tapegrad::optim {

namespace {

template <double D> AdamOptions plain(const AdamHyperparameters<D>& o) {
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
}

}  // namespace

Adam::Adam(nn::ParameterList parameters, AdamOptions options)
    : Adam("Adam", std::move(parameters), options, false) {}

Adam::Adam(std::string name, nn::ParameterList parameters, AdamOptions options, bool decoupled_weight_decay)
    : Optimizer(std::move(name), std::move(parameters), 2), options_(options), decoupled_(decoupled_weight_decay) {
  check_options(options);
}

void Adam::check_options(const AdamOptions& options) const {
  require(options.lr >= 0, "lr", ">= 0", options.lr);
  require(options.beta1 >= 0 && options.beta1 < 1, "beta1", "in [0, 1)", options.beta1);
  require(options.beta2 >= 0 && options.beta2 < 1, "beta2", "in [0, 1)", options.beta2);
  require(options.eps > 0, "eps", "> 0", options.eps);
  require(options.weight_decay >= 0, "weight_decay", ">= 0", options.weight_decay);
}

std::vector<std::pair<std::string, double>> Adam::hyperparameters() const {
  return {{"lr", options_.lr},
          {"beta1", options_.beta1},
          {"beta2", options_.beta2},
          {"eps", options_.eps},
          {"weight_decay", options_.weight_decay}};
}

void Adam::set_hyperparameters(const std::map<std::string, double, std::less<>>& values) {
  const AdamOptions options{.lr = values.at("lr"),
                            .beta1 = values.at("beta1"),
                            .beta2 = values.at("beta2"),
                            .eps = values.at("eps"),
                            .weight_decay = values.at("weight_decay")};
  check_options(options);
  options_ = options;
}

template <class S> AdamRule<S> Adam::rule(std::int64_t t) const {
  // The bias corrections and the decay factor in f64, then rounded to S, as PyTorch computes them in Python floats.
  const double steps = static_cast<double>(t);
  return {.beta1 = static_cast<S>(options_.beta1),
          .beta2 = static_cast<S>(options_.beta2),
          .eps = static_cast<S>(options_.eps),
          .weight_decay = static_cast<S>(options_.weight_decay),
          .decay = static_cast<S>(1 - options_.lr * options_.weight_decay),
          .step_size = static_cast<S>(options_.lr / (1 - std::pow(options_.beta1, steps))),
          .bias_correction2_sqrt = static_cast<S>(std::sqrt(1 - std::pow(options_.beta2, steps))),
          .decoupled = decoupled_};
}

void Adam::update(UpdateTarget& target, std::int64_t t) const { target.apply(rule<float>(t), rule<double>(t)); }

AdamW::AdamW(nn::ParameterList parameters, AdamWOptions options)
    : Adam("AdamW", std::move(parameters), plain(options), true) {}

}  // namespace tapegrad::optim
