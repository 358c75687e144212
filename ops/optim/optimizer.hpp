// The interface optimizers share (step, zero_grad) and the loop that applies an update rule to each parameter.
//
// Each parameter gets a few state buffers of its shape (SGD's momentum, Adam's two moments) in state_t<T>: f32 for
// f32, bf16 and f16 parameters, f64 for f64 parameters (f32 state would cost an f64 parameter its precision). An
// update reads the parameter and its gradient into that precision, computes there, and writes the parameter back
// in its own dtype, rounded once to nearest even, in place: the module holding the same Var sees the new values.
// A parameter that has no gradient (none arrived since zero_grad) is skipped and its state left as it is, as in
// PyTorch; each parameter counts its own updates (Adam's bias correction uses that count).
//
// Parameters may live on any device, each with its gradient on the same device; the state is created on the
// parameter's device. On a GPU each parameter's update is one fused kernel that applies the same per-element rule
// as the CPU loop (cuda/detail/update_rules.hpp), so both give bitwise the same parameters and state. Move a module's
// parameters to their device before the optimizer's first step: state made on one device is not moved to another.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tapegrad/ops/nn/module.hpp"
#include "tapegrad/ops/nn/parameter.hpp"
#include "tapegrad/cuda/detail/update_rules.hpp"

namespace tapegrad::optim {

// The precision of a T parameter's optimizer state and of its update's arithmetic.
template <class T> using state_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// One parameter's update, on the parameter's device: an optimizer hands it the rule of the update in both state
// precisions, and the parameter's dtype picks one (f64 for f64 parameters, else f32).
class UpdateTarget {
 public:
  virtual void apply(const SGDRule<float>& f32, const SGDRule<double>& f64) = 0;
  virtual void apply(const AdamRule<float>& f32, const AdamRule<double>& f64) = 0;

 protected:
  ~UpdateTarget() = default;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;  // copies would share state buffers
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;

  // One update of every parameter that has a gradient. Throws, changing nothing, when a gradient's shape is not its
  // parameter's.
  void step();
  // Clears every parameter's gradient.
  void zero_grad();
  const nn::ParameterList& parameters() const { return parameters_; }

  // The optimizer's state for checkpoints (PyTorch's names): "hyperparameters.<name>" (f64 scalars: lr, betas, ...;
  // a flag as 0 or 1), and per parameter path "state.<path>.step" (its updates, an i64 scalar) and, once it has
  // state, "state.<path>.<buffer>" ("momentum_buffer"; "exp_avg", "exp_avg_sq") in the state's precision. The
  // buffers share the optimizer's storage (saving copies them).
  nn::StateDict state_dict() const;
  // Takes back what state_dict gave, for the same parameters: a run resumed from it continues bitwise as the
  // uninterrupted one. Every problem (missing or unexpected entries, wrong dtypes or shapes, hyperparameters out of
  // range) is reported at once in one Error naming the optimizer and each entry, and then nothing is changed.
  void load_state_dict(const nn::StateDict& dict);

 protected:
  // `name` prefixes every error; `state_buffers` (at most max_state_buffers) is the rule's buffer count per parameter.
  // Throws when a parameter is undefined or appears twice.
  Optimizer(std::string name, nn::ParameterList parameters, int state_buffers);
  // Throws "<name>: <what> must be <rule>, got <value>" unless `ok`.
  void require(bool ok, std::string_view what, std::string_view rule, double value) const;


 private:
  // Applies the rule of a parameter's update number t (1 on its first) to `target`.
  virtual void update(UpdateTarget& target, std::int64_t t) const = 0;
  // The names of the rule's state buffers, in the order the rule keeps them.
  virtual std::vector<std::string> buffer_names() const = 0;
  // The hyperparameters by name, and setting them all back (checked as the constructor checks them, and against
  // the state buffers the optimizer was made with); `values` holds exactly the names hyperparameters() gives.
  virtual std::vector<std::pair<std::string, double>> hyperparameters() const = 0;
  virtual void set_hyperparameters(const std::map<std::string, double, std::less<>>& values) = 0;

  struct ParameterState {
    std::int64_t updates = 0;
    std::vector<Tensor<float>> f32;   // for f32, bf16 and f16 parameters
    std::vector<Tensor<double>> f64;  // for f64 parameters
    template <class S> std::vector<Tensor<S>>& buffers() {
      if constexpr (std::is_same_v<S, double>) {
        return f64;
      } else {
        return f32;
      }
    }
    // Where the state was made; none before the first update (or for a rule without state).
    std::optional<Device> device() const {
      if (!f32.empty()) return f32.front().device();
      if (!f64.empty()) return f64.front().device();
      return std::nullopt;
    }
  };
  // Throws naming the parameter when its gradient's shape or device, or its state's device, is not its own.
  template <class T>
  void check_parameter(const std::string& path, const Var<T>& var, const ParameterState& state) const;
  template <class T> void update_parameter(const Var<T>& var, ParameterState& state);

  std::string name_;
  nn::ParameterList parameters_;
  std::vector<ParameterState> states_;
  int state_buffers_;
};

// Names plain Vars by their position ("0", "1", ...), for optimizers built from a list of Vars.
nn::ParameterList numbered(const std::vector<nn::AnyVar>& vars);

}  // namespace tapegrad::optim
