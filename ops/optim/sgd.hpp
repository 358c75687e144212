// Stochastic gradient descent with momentum, PyTorch's torch.optim.SGD. Per element, with g the gradient:
//
//   g = g + weight_decay·p                        (L2 regularization through the gradient)
//   b = g on a parameter's first update, else momentum·b + (1 - dampening)·g     (only when momentum != 0)
//   g = nesterov ? g + momentum·b : b              (only when momentum != 0)
//   p = p - lr·g
//
// State precision, devices and skipped parameters: ops/optim/optimizer.hpp; the rule: cuda/detail/update_rules.hpp.
#pragma once

#include "tapegrad/ops/optim/optimizer.hpp"

namespace tapegrad::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening 0
};

class SGD final : public Optimizer {
 public:
  // Throws naming the option when one is out of range.
  explicit SGD(nn::ParameterList parameters, SGDOptions options = {});
  explicit SGD(const std::vector<nn::AnyVar>& parameters, SGDOptions options = {})
      : SGD(numbered(parameters), options) {}

  const SGDOptions& options() const { return options_; }

 private:
  // Throws naming the option when one is out of range.
  void check_options(const SGDOptions& options) const;
  // The rule of a parameter's update number t, in state precision S.
  template <class S> SGDRule<S> rule(std::int64_t t) const;
  void update(UpdateTarget& target, std::int64_t t) const override;
  std::vector<std::string> buffer_names() const override;
  std::vector<std::pair<std::string, double>> hyperparameters() const override;
  void set_hyperparameters(const std::map<std::string, double, std::less<>>& values) override;

  SGDOptions options_;
};

}  // namespace tapegrad::optim
