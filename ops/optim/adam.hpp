// Adam and AdamW, PyTorch's torch.optim.Adam and AdamW. Per element, with g the gradient and t the parameter's
// update count (1 on its first):
//
//   Adam:  g = g + weight_decay·p          (L2 regularization through the gradient, scaled by Adam like it)
//   AdamW: p = p·(1 - lr·weight_decay)     (decoupled decay, independent of the gradient's scale)
//   m = β₁·m + (1 - β₁)·g,   v = β₂·v + (1 - β₂)·g²
//   p = p - (lr / (1 - β₁ᵗ)) · m / (sqrt(v) / sqrt(1 - β₂ᵗ) + eps)
//
// State precision, devices and skipped parameters: ops/optim/optimizer.hpp; the rule: cuda/detail/update_rules.hpp.
#pragma once

#include "tapegrad/ops/optim/optimizer.hpp"

namespace tapegrad::optim {

// The hyperparameters; Adam's and AdamW's differ only in weight_decay's default (PyTorch's: 0 and 0.01).
template <double DefaultWeightDecay> struct AdamHyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = DefaultWeightDecay;
};
using AdamOptions = AdamHyperparameters<0.0>;
using AdamWOptions = AdamHyperparameters<0.01>;

class Adam : public Optimizer {
 public:
  // Throws naming the option when one is out of range.
  explicit Adam(nn::ParameterList parameters, AdamOptions options = {});
  explicit Adam(const std::vector<nn::AnyVar>& parameters, AdamOptions options = {})
      : Adam(numbered(parameters), options) {}

  const AdamOptions& options() const { return options_; }
  bool decoupled_weight_decay() const { return decoupled_; }

 protected:
  Adam(std::string name, nn::ParameterList parameters, AdamOptions options, bool decoupled_weight_decay);

 private:
  // Throws naming the option when one is out of range.
  void check_options(const AdamOptions& options) const;
  // The rule of a parameter's update number t, in state precision S.
  template <class S> AdamRule<S> rule(std::int64_t t) const;
  void update(UpdateTarget& target, std::int64_t t) const override;
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<std::pair<std::string, double>> hyperparameters() const override;
  void set_hyperparameters(const std::map<std::string, double, std::less<>>& values) override;

  AdamOptions options_;
  bool decoupled_;
};

class AdamW final : public Adam {
 public:
  explicit AdamW(nn::ParameterList parameters, AdamWOptions options = {});
  explicit AdamW(const std::vector<nn::AnyVar>& parameters, AdamWOptions options = {})
      : AdamW(numbered(parameters), options) {}
};

}  // namespace tapegrad::optim
