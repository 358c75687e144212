#include "tapegrad/ops/nn/module.hpp"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "tapegrad/ops/layout.hpp"
#include "tapegrad/ops/nn/detail/load_problems.hpp"

namespace tapegrad::nn {

namespace {

// Moves the variable's value and gradient to `device` in place (a no-op for those already there).
template <class T> void move_to(const Var<T>& var, Device device) {
  VarImpl<T>& slot = *var.slot();
  slot.value = slot.value.to(device);
  if (slot.grad.defined()) slot.grad = slot.grad.to(device);
}

// SplitMix64's finalizer: consecutive inputs give unrelated outputs.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t derive_seed(std::uint64_t seed, std::string_view name) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a of the name
  for (char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return mix(mix(seed + 0x9e3779b97f4a7c15ULL) ^ hash);
}

Module::Module(std::string type_name, Device device) : type_name_(std::move(type_name)), device_(device) {}

template <class P>
Tensor<P> Module::shard_block(const Tensor<P>& whole, const ParameterShard& shard, const std::string& what) {
  check(shard.axis >= 0 && shard.axis < whole.rank() && shard.ranks >= 1 && shard.rank >= 0 &&
            shard.rank < shard.ranks && whole.dim(shard.axis) % shard.ranks == 0,
        what, ": shape ", whole.shape(), " does not split along axis ", shard.axis, " into ", shard.ranks,
        " equal shards (rank ", shard.rank, "'s asked for)");
  const std::int64_t size = whole.dim(shard.axis) / shard.ranks;
  const NoGradGuard no_grad;
  return slice(constant(whole), shard.axis, shard.rank * size, (shard.rank + 1) * size).value();
}
#define TAPEGRAD_INSTANTIATE_SHARD_BLOCK(P) \
  template Tensor<P> Module::shard_block(const Tensor<P>&, const ParameterShard&, const std::string&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_SHARD_BLOCK)

ParameterList Module::own_parameters() const {
  ParameterList list;
  for (const auto& p : parameters_) {
    std::visit([&](auto* var) { list.push_back({p.name, *var, p.shard}); }, p.slot);
  }
  return list;
}

ParameterList Module::parameters() const {
  ParameterList list = own_parameters();
  for (const auto& child : children_) {
    for (NamedParameter& p : child.module->parameters()) {
      p.path = child.name + "." + p.path;
      list.push_back(std::move(p));
    }
  }
  return list;
}

void Module::set_parameter(std::string_view path, const AnyVar& value) {
  const auto dot = path.find('.');
  if (dot != std::string_view::npos) {
    const std::string_view head = path.substr(0, dot);
    const auto child = std::find_if(children_.begin(), children_.end(), [&](const Child& c) { return c.name == head; });
    check(child != children_.end(), type_name_, "no child module '", head, "' (in parameter path '", path, "')");
    child->module->set_parameter(path.substr(dot + 1), value);
    return;
  }
  const auto own =
      std::find_if(parameters_.begin(), parameters_.end(), [&](const OwnParameter& p) { return p.name == path; });
  check(own != parameters_.end(), type_name_, "no parameter '", path, "'");
  std::visit(
      [&](auto* slot, const auto& var) {
        using Slot = std::remove_pointer_t<decltype(slot)>;
        if constexpr (std::is_same_v<Slot, std::remove_cvref_t<decltype(var)>>) {
          check(var.defined(), type_name_, "parameter '", path, "' has shape ", slot->shape(),
                " but the new value has shape (undefined)");
          check(var.shape() == slot->shape(), type_name_, "parameter '", path, "' has shape ", slot->shape(),
                " but the new value has shape ", var.shape());
          *slot = var;
        } else {
          check(false, type_name_, "parameter '", path, "' is ", dtype_name(Slot::dtype()), " but the new value is ",
                dtype_name(var.dtype()));
        }
      },
      own->slot, value);
}

namespace {

// Calls fn(prefix, module) for the module (M: Module or const Module) and each descendant, depth first, with the
// prefix of their paths: "", then "child.", "child.grandchild." ...
template <class M, class Fn> void for_each_module(M& module, const std::string& prefix, const Fn& fn) {
  fn(prefix, module);
  for (const Module::Child& child : module.children()) {
    for_each_module(static_cast<M&>(*child.module), prefix + child.name + ".", fn);
  }
}

// `value` in P on `device`: cast where the dtypes differ (LoadOptions::cast), copied where the devices do.
template <class P> Tensor<P> as_parameter(const AnyTensor& value, Device device) {
  return std::visit(
      [&](const auto& t) {
        using T = typename std::remove_cvref_t<decltype(t)>::value_type;
        if constexpr (std::is_same_v<T, P>) {
          return t.to(device);
        } else if constexpr (std::is_integral_v<T>) {
          throw Error("load_state_dict: an integer tensor does not cast to a parameter");  // (checked before)
          return Tensor<P>();
        } else {
          return cast<P>(t.to(Device::cpu())).to(device);
        }
      },
      value.variant());
}

}  // namespace

StateDict Module::state_dict() const {
  StateDict dict;
  for (const NamedParameter& p : parameters()) {
    std::visit([&](const auto& var) { dict.emplace(p.path, var.value()); }, p.var);
  }
  for_each_module(*this, "", [&](const std::string& prefix, const Module& module) {
    for (const auto& [name, value] : module.own_buffers()) dict.emplace(prefix + name, value);
  });
  return dict;
}

void Module::load_state_dict(const StateDict& dict, const LoadOptions& options) {
  std::vector<std::string> problems;
  std::set<std::string, std::less<>> known;
  // The entry of `path` for something of `dtype` and `shape`; null where it is missing (a problem where strict) or
  // does not fit (always a problem).
  const auto entry_for = [&](const std::string& path, DType dtype, const Shape& shape,
                             bool castable) -> const AnyTensor* {
    known.insert(path);
    const auto at = dict.find(path);
    if (at == dict.end()) {
      if (options.strict) problems.push_back("'" + path + "' is missing");
      return nullptr;
    }
    const AnyTensor& value = at->second;
    if (!value.defined()) {
      problems.push_back("'" + path + "' is undefined");
      return nullptr;
    }
    bool fits = true;
    if (value.shape() != shape) {
      problems.push_back(
          tapegrad::detail::concat("'", path, "' has shape ", value.shape(), ", the module's is ", shape));
      fits = false;
    }
    const bool float_value = value.dtype() != DType::i32 && value.dtype() != DType::i64;
    if (value.dtype() != dtype && !(castable && options.cast && float_value)) {
      problems.push_back("'" + path + "' is " + std::string(dtype_name(value.dtype())) + ", the module's is " +
                         std::string(dtype_name(dtype)) +
                         (castable && float_value ? " (LoadOptions::cast rounds it to that)" : ""));
      fits = false;
    }
    return fits ? &value : nullptr;
  };
  std::vector<std::pair<const NamedParameter*, const AnyTensor*>> parameter_values;
  const ParameterList parameters = this->parameters();
  for (const NamedParameter& p : parameters) {
    if (const AnyTensor* value = entry_for(p.path, p.dtype(), p.shape(), true)) {
      parameter_values.emplace_back(&p, value);
    }
  }
  std::vector<std::pair<Module*, StateDict>> buffer_values;
  for_each_module(*this, "", [&](const std::string& prefix, Module& module) {
    StateDict own;
    bool complete = true;
    for (const auto& [name, current] : module.own_buffers()) {
      const AnyTensor* value = entry_for(prefix + name, current.dtype(), current.shape(), false);
      if (value) own.emplace(name, *value);
      else complete = false;
    }
    if (complete && !own.empty()) buffer_values.emplace_back(&module, std::move(own));
  });
  if (options.strict) {
    for (const auto& [path, value] : dict) {
      if (!known.contains(path)) problems.push_back("'" + path + "' is not in the module");
    }
  }
  if (!problems.empty()) detail::throw_load_problems(type_name_, problems);
  for (const auto& [p, value] : parameter_values) {
    std::visit(
        [&](const auto& var) {
          using P = typename std::remove_cvref_t<decltype(var.value())>::value_type;
          const Tensor<P> loaded = as_parameter<P>(*value, var.device());
          Tensor<P>& slot = var.slot()->value;
          if (slot.numel() > 0) {
            copy_bytes(slot.data(), slot.device(), loaded.data(), loaded.device(), slot.numel() * sizeof(P));
          }
        },
        p->var);
  }
  for (auto& [module, buffers] : buffer_values) module->load_own_buffers(buffers);
  parameters_changed();
}

void Module::parameters_changed() {
  for_each_module(*this, "", [](const std::string&, Module& module) { module.own_parameters_changed(); });
}

Module& Module::to(Device device) {
  for (const OwnParameter& p : parameters_) std::visit([&](const auto* var) { move_to(*var, device); }, p.slot);
  for (const Child& child : children_) child.module->to(device);
  device_ = device;
  return *this;
}

void Module::add_child(std::string name, Module& child) {
  check(&child != this, type_name_, "a module cannot be its own child ('", name, "')");
  check_new_name(name, true);
  children_.push_back({std::move(name), &child});
}

void Module::check_input(const Shape& x, std::int64_t features, int min_rank) const {
  check(x.rank() >= min_rank, type_name_, "input of shape ", x, " should have at least ", min_rank,
        min_rank == 1 ? " axis" : " axes", ", the last of size ", features);
  check(x.dim(-1) == features, type_name_, "input of shape ", x, " has ", x.dim(-1),
        " features in its last axis but the module was built for ", features);
}

void Module::check_new_name(const std::string& name, bool defined) const {
  check(!name.empty() && name.find('.') == std::string::npos, type_name_, "name '", name,
        "' must be non-empty and contain no '.'");
  check(defined, type_name_, "parameter '", name, "' is an undefined Var");
  const bool taken =
      std::any_of(parameters_.begin(), parameters_.end(), [&](const OwnParameter& p) { return p.name == name; }) ||
      std::any_of(children_.begin(), children_.end(), [&](const Child& c) { return c.name == name; });
  check(!taken, type_name_, "the name '", name, "' is already registered");
}

}  // namespace tapegrad::nn
