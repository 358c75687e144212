#include "ops/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <utility>

#include "tensor/eigen.hpp"
#include "tensor/factories.hpp"

namespace tapegrad::optim {

namespace {

// The variable itself (shared by every handle on it), to find a parameter listed twice.
const void* identity(const nn::AnyVar& var) {
  return std::visit([](const auto& v) -> const void* { return v.slot().get(); }, var);
}

// Elements converted to state precision at a time, on the stack.
constexpr std::int64_t block_size = 256;

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

  Tensor<T> value = var.value();  // a handle on the parameter's storage: written in place
  if (!var.device().is_cpu()) {
    cuda::ParameterBuffers device_buffers{dtype_v<T>, value.data(), grad.data(), {}, var.numel(), var.device().index};
    for (int k = 0; k < state_buffers_; ++k) device_buffers.state[k] = buffers[k].data();
    update_on_device(device_buffers, t);
    return;
  }
  parallel_for(var.numel(), 20, [&](std::int64_t begin, std::int64_t end) {
    std::array<S, block_size> p, g;
    for (std::int64_t start = begin; start < end; start += block_size) {
      Chunk<S> chunk{p.data(), g.data(), {}, std::min(block_size, end - start)};
      for (int k = 0; k < state_buffers_; ++k) chunk.state[k] = buffers[k].data() + start;
      for (std::int64_t i = 0; i < chunk.size; ++i) {
        p[i] = convert<S>(value.flat(start + i));
        g[i] = convert<S>(grad.flat(start + i));
      }
      update(chunk, t);
      for (std::int64_t i = 0; i < chunk.size; ++i) value.flat(start + i) = convert<T>(p[i]);
    }
  });
}

nn::ParameterList numbered(const std::vector<nn::AnyVar>& vars) {
  nn::ParameterList list;
  for (std::size_t i = 0; i < vars.size(); ++i) list.push_back({std::to_string(i), vars[i]});
  return list;
}

}  // namespace tapegrad::optim
