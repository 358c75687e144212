#include "tapegrad/ops/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "tapegrad/cuda/optim.hpp"
#include "tapegrad/ops/nn/detail/load_problems.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad::optim {

namespace {

// The variable itself (shared by every handle on it), to find a parameter listed twice.
const void* identity(const nn::AnyVar& var) {
  return std::visit([](const auto& v) -> const void* { return v.slot().get(); }, var);
}

// Elements converted to state precision at a time, on the stack.
constexpr std::int64_t block_size = 256;

// One T parameter with its gradient and its state buffers (state precision S = state_t<T>), updated in place.
template <class T> class ParameterUpdate final : public UpdateTarget {
 public:
  using S = state_t<T>;
  ParameterUpdate(Tensor<T> value, const Tensor<T>& grad, std::vector<Tensor<S>>& state, int state_buffers)
      : value_(std::move(value)), grad_(grad), state_(state), state_buffers_(state_buffers) {}

  void apply(const SGDRule<float>& f32, const SGDRule<double>& f64) override { run(f32, f64); }
  void apply(const AdamRule<float>& f32, const AdamRule<double>& f64) override { run(f32, f64); }

 private:
  template <class RuleF32, class RuleF64> void run(const RuleF32& f32, const RuleF64& f64) {
    if constexpr (std::is_same_v<S, double>) {
      run(f64);
    } else {
      run(f32);
    }
  }
  // The rule on every element: on the cpu in blocks converted to S, on a GPU in one fused kernel.
  template <class Rule> void run(const Rule& rule) {
    by_device("optimizer step", value_.device(), [&] { run_on_cpu(rule); },
              [&](auto gpu) {
                cuda::ParameterBuffers buffers{dtype_v<T>, value_.data(), grad_.data(), {}, value_.numel(), gpu.index};
                for (int k = 0; k < state_buffers_; ++k) buffers.state[k] = state_[k].data();
                cuda::optimizer_step(buffers, rule);
              });
  }
  template <class Rule> void run_on_cpu(const Rule& rule) {
    parallel_for(value_.numel(), 20, [&](std::int64_t begin, std::int64_t end) {
      std::array<S, block_size> p, g;
      std::array<S*, max_state_buffers> state{};
      for (std::int64_t start = begin; start < end; start += block_size) {
        const std::int64_t size = std::min(block_size, end - start);
        for (int k = 0; k < state_buffers_; ++k) state[k] = state_[k].data() + start;
        for (std::int64_t i = 0; i < size; ++i) {
          p[i] = convert<S>(value_.flat(start + i));
          g[i] = convert<S>(grad_.flat(start + i));
        }
        for (std::int64_t i = 0; i < size; ++i) rule(p[i], g[i], state.data(), i);
        for (std::int64_t i = 0; i < size; ++i) value_.flat(start + i) = convert<T>(p[i]);
      }
    });
  }

  Tensor<T> value_;  // a handle on the parameter's storage
  const Tensor<T>& grad_;
  std::vector<Tensor<S>>& state_;  // written in place
  int state_buffers_;
};

}  // namespace

Optimizer::Optimizer(std::string name, nn::ParameterList parameters, int state_buffers)
    : name_(std::move(name)),
      parameters_(std::move(parameters)),
      states_(parameters_.size()),
      state_buffers_(state_buffers) {
  check(state_buffers >= 0 && state_buffers <= max_state_buffers, name_, "an optimizer keeps at most ",
        max_state_buffers, " state buffers per parameter, asked for ", state_buffers);
  std::unordered_map<const void*, const std::string*> seen;
  for (const nn::NamedParameter& p : parameters_) {
    check(identity(p.var) != nullptr, name_, "parameter '", p.path, "' is an undefined Var");
    const auto [at, inserted] = seen.emplace(identity(p.var), &p.path);
    check(inserted, name_, "parameter '", p.path, "' is the same variable as parameter '", *at->second,
          "': each parameter may appear only once");
  }
}

void Optimizer::require(bool ok, std::string_view what, std::string_view rule, double value) const {
  check(ok, name_, what, " must be ", rule, ", got ", value);
  check(std::isfinite(value), name_, what, " must be finite, got ", value);
}

void Optimizer::step() {
  // Every parameter is checked before any changes, so that a bad one leaves them all as they were.
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    std::visit([&](const auto& var) { check_parameter(parameters_[i].path, var, states_[i]); }, parameters_[i].var);
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    std::visit([&](const auto& var) { update_parameter(var, states_[i]); }, parameters_[i].var);
  }
}

void Optimizer::zero_grad() {
  for (nn::NamedParameter& p : parameters_) std::visit([](auto& var) { var.zero_grad(); }, p.var);
}

template <class T>
void Optimizer::check_parameter(const std::string& path, const Var<T>& var, const ParameterState& state) const {
  const Tensor<T>& grad = var.grad();
  if (!grad.defined()) return;
  check(grad.shape() == var.shape(), name_, "parameter '", path, "' has a gradient of shape ", grad.shape(),
        " but its value has shape ", var.shape());
  check(grad.device() == var.device(), name_, "parameter '", path, "' is on ", var.device(),
        " but its gradient is on ", grad.device());
  const std::optional<Device> state_device = state.device();
  check(!state_device || *state_device == var.device(), name_, "parameter '", path, "' is on ", var.device(),
        " but its optimizer state is on ", state_device.value_or(var.device()),
        ": move parameters to their device before the optimizer's first step");
}

template <class T>
void Optimizer::update_parameter(const Var<T>& var, ParameterState& state) {
  using S = state_t<T>;
  const Tensor<T>& grad = var.grad();
  if (!grad.defined()) return;
  std::vector<Tensor<S>>& buffers = state.buffers<S>();
  while (static_cast<int>(buffers.size()) < state_buffers_) buffers.push_back(zeros<S>(var.shape(), var.device()));
  const std::int64_t t = ++state.updates;

  ParameterUpdate<T> target(var.value(), grad, buffers, state_buffers_);
  update(target, t);
}

nn::StateDict Optimizer::state_dict() const {
  nn::StateDict dict;
  for (const auto& [name, value] : hyperparameters()) {
    dict.emplace("hyperparameters." + name, from_vector<double>({value}, {}));
  }
  const std::vector<std::string> buffers = buffer_names();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const std::string prefix = "state." + parameters_[i].path + ".";
    const ParameterState& state = states_[i];
    dict.emplace(prefix + "step", from_vector<std::int64_t>({state.updates}, {}));
    for (std::size_t k = 0; k < state.f32.size(); ++k) dict.emplace(prefix + buffers[k], state.f32[k]);
    for (std::size_t k = 0; k < state.f64.size(); ++k) dict.emplace(prefix + buffers[k], state.f64[k]);
  }
  return dict;
}

void Optimizer::load_state_dict(const nn::StateDict& dict) {
  std::vector<std::string> problems;
  std::set<std::string, std::less<>> known;
  // The entry of `key` if it has `dtype` and `shape`, else null and a problem.
  const auto entry = [&](const std::string& key, DType dtype, const Shape& shape) -> const AnyTensor* {
    known.insert(key);
    const auto at = dict.find(key);
    if (at == dict.end()) {
      problems.push_back("'" + key + "' is missing");
      return nullptr;
    }
    const AnyTensor& value = at->second;
    if (!value.defined() || value.dtype() != dtype || value.shape() != shape) {
      std::ostringstream text;
      text << "'" << key << "' is ";
      if (value.defined()) text << dtype_name(value.dtype()) << " " << value.shape();
      else text << "undefined";
      text << ", not " << dtype_name(dtype) << " " << shape;
      problems.push_back(text.str());
      return nullptr;
    }
    return &value;
  };
  const auto scalar = [](const AnyTensor& value, auto tag) {
    return value.get<decltype(tag)>().to(Device::cpu()).item();
  };
  std::map<std::string, double, std::less<>> values;
  for (const auto& [name, current] : hyperparameters()) {
    if (const AnyTensor* value = entry("hyperparameters." + name, DType::f64, Shape{})) {
      values.emplace(name, scalar(*value, double{}));
    }
  }
  const std::vector<std::string> buffers = buffer_names();
  std::vector<std::int64_t> updates(parameters_.size(), 0);
  std::vector<std::vector<const AnyTensor*>> buffer_values(parameters_.size());
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const nn::NamedParameter& p = parameters_[i];
    const std::string prefix = "state." + p.path + ".";
    if (const AnyTensor* step = entry(prefix + "step", DType::i64, Shape{})) {
      updates[i] = scalar(*step, std::int64_t{});
      if (updates[i] < 0) problems.push_back("'" + prefix + "step' is " + std::to_string(updates[i]) + ", below 0");
    }
    if (updates[i] <= 0) continue;  // no state before the first update
    const DType state_dtype = p.dtype() == DType::f64 ? DType::f64 : DType::f32;
    for (const std::string& buffer : buffers) {
      buffer_values[i].push_back(entry(prefix + buffer, state_dtype, p.shape()));
    }
  }
  for (const auto& [key, value] : dict) {
    if (!known.contains(key)) problems.push_back("'" + key + "' is not this optimizer's");
  }
  if (!problems.empty()) nn::detail::throw_load_problems(name_, problems);
  try {
    set_hyperparameters(values);  // (checked: it throws before it changes anything)
  } catch (const Error& e) {
    nn::detail::throw_load_problems(name_, {e.what()});
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    ParameterState& state = states_[i];
    state = ParameterState{.updates = updates[i], .f32 = {}, .f64 = {}};
    const Device device = parameters_[i].device();
    for (const AnyTensor* value : buffer_values[i]) {
      std::visit(
          [&](const auto& t) {
            using S = typename std::remove_cvref_t<decltype(t)>::value_type;
            if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
              // A copy of its own: the optimizer updates its buffers in place.
              state.buffers<S>().push_back(t.device() == device ? t.clone() : t.to(device));
            }
          },
          value->variant());
    }
  }
}

nn::ParameterList numbered(const std::vector<nn::AnyVar>& vars) {
  nn::ParameterList list;
  for (std::size_t i = 0; i < vars.size(); ++i) list.push_back({std::to_string(i), vars[i]});
  return list;
}

}  // namespace tapegrad::optim
