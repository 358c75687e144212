#include "tapegrad/ops/nn/module.hpp"

#include <algorithm>

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

ParameterList Module::own_parameters() const {
  ParameterList list;
  for (const auto& p : parameters_) {
    std::visit([&](auto* var) { list.push_back({p.name, *var}); }, p.slot);
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
