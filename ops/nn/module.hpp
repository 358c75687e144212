// nn::Module: the base of every neural-network module. A module owns named parameters and names its child
// modules; parameters() walks both, giving dotted paths ("attn.qkv.kernel").
//
// Parameters and children are registered BY ADDRESS (a subclass registers its own members), so a Module is
// neither copyable nor movable: a copy would still point at the original's members.
//
// Devices: a module makes its parameters on the device it was constructed with (every module here takes a trailing
// `Device device = Device::cpu()` and hands it to its children), the same values on every device for one seed
// (tensor/initializers.hpp says how exactly). `to(device)` moves an existing module's parameters instead.
//
//   template <class P, class C = void> class Block : public nn::Module {
//    public:
//     Block(std::int64_t hidden, std::uint64_t seed, Device device = Device::cpu())
//         : Module("Block", device),
//           proj_(hidden, {.dense = {.features = hidden}}, nn::derive_seed(seed, "proj"), device) {
//       add_child("proj", proj_);
//     }
//     template <class T> auto operator()(const Var<T>& x) const {
//       return traced([this](const Var<T>& x) { return proj_(x); }, x);  // reports the call to summary()
//     }
//    private:
//     nn::LayerNormDense<P, C> proj_;
//   };
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tapegrad/ops/nn/detail/call_trace.hpp"
#include "tapegrad/ops/nn/parameter.hpp"
#include "tapegrad/tensor/initializers.hpp"
#include "tapegrad/tensor/io/safetensors.hpp"

namespace tapegrad::nn {

// A seed for the part of a module called `name`, derived from the module's seed: each parameter and child draws
// from its own stream, and the same seed always gives the same parameters.
std::uint64_t derive_seed(std::uint64_t seed, std::string_view name);

// A module's state as tensors by dotted path (what safetensors files hold: safetensors::TensorMap).
using StateDict = safetensors::TensorMap;

struct LoadOptions {
  bool strict = true;  // entries missing from the dict, and entries the module has not, are errors; else skipped
  bool cast = false;   // a parameter's entry in another float dtype is rounded to the parameter's; else an error
};

class Module {
 public:
  struct Child {
    std::string name;
    Module* module;
  };

  // `device`: where init_parameter makes this module's parameters.
  explicit Module(std::string type_name, Device device = Device::cpu());
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's kind, as summary() shows it ("LayerNormDense").
  const std::string& type_name() const { return type_name_; }
  // This module's own parameters, named without a prefix, in registration order.
  ParameterList own_parameters() const;
  // Own parameters, then each child's (depth first, in registration order), with dotted paths.
  ParameterList parameters() const;
  const std::vector<Child>& children() const { return children_; }
  // Where init_parameter makes parameters: the construction's device, or the last to()'s.
  Device device() const { return device_; }

  // Moves every parameter of this module and its children to `device` in place: each parameter stays the same
  // variable (the module, an optimizer or a user holding it sees the moved value) and its gradient moves with it.
  // Build optimizers after moving (their state stays where it was made), and do not move between a forward pass
  // and its backward (the pass saved the old tensors).
  Module& to(Device device);

  // Points parameter `path` (dotted, as parameters() names it) at `value`, which must have the parameter's dtype
  // and shape; the module then computes with `value`. (How a test differentiates a module with respect to Vars it
  // did not create, or how trained values are loaded.)
  void set_parameter(std::string_view path, const AnyVar& value);

  // The module's state by dotted path: every parameter (sharing its storage) and what modules keep besides
  // parameters ("buffers": delayed scaling's histories and scales, e.g. "mlp.fp8_amax_history").
  StateDict state_dict() const;
  // Copies each entry into the parameter or buffer of its path, in place: the module, optimizers and users holding a
  // parameter see the loaded values, on the parameter's device and in its dtype (a bf16 module stays bf16). Every
  // problem (missing and unexpected entries where strict, wrong shapes, wrong dtypes unless cast) is reported at
  // once, in one Error naming the module and each path, and then nothing is changed.
  void load_state_dict(const StateDict& dict, const LoadOptions& options = {});
  // Says that parameter values of this module or its children changed in place (an optimizer's step), so that
  // copies made from them are made again: the fp8 weight caches of modules configured with one
  // (`.fp8_weight_cache`). load_state_dict calls it; a module without such copies ignores it.
  void parameters_changed();

  // Registers `parameter`, a member of the subclass, as own parameter `name`.
  // With `shard`, the parameter is that block of the whole (checkpoints save and reassemble it: save_sharded).
  template <class P>
  void add_parameter(std::string name, Var<P>& parameter, std::optional<ParameterShard> shard = {}) {
    static_assert(is_float_dtype_v<P>, "parameters are f32, f64, bf16 or f16");
    check_new_name(name, parameter.defined());
    parameters_.push_back({std::move(name), &parameter, shard});
  }
  // Makes `parameter` directly in P on device() from `init` (drawn from derive_seed(seed, name)) and registers it.
  // With `shard`, `shape` is the whole parameter's: it is drawn whole (the same values as an unsharded module's) and
  // the shard's block kept.
  template <class P>
  void init_parameter(std::string name, Var<P>& parameter, const Initializer& init, const Shape& shape,
                      std::uint64_t seed, const FanAxes& axes = {}, std::optional<ParameterShard> shard = {}) {
    Tensor<P> whole = init.make<P>(shape, derive_seed(seed, name), axes, device_);
    parameter = param(shard ? shard_block(whole, *shard, type_name_ + "." + name) : whole);
    add_parameter(std::move(name), parameter, shard);
  }
  // Registers `child`, a member of the subclass, as child `name`.
  void add_child(std::string name, Module& child);

  // Lines that summary() shows under the module's type: settings that change what a call computes and that the
  // inputs and parameters do not show (LayerNormMLP's fp8 recipe and its state's step). None by default.
  virtual std::vector<std::string> summary_notes() const { return {}; }

 protected:
  // The module's own buffers, named without a prefix (none by default), and how it takes them back:
  // load_own_buffers receives exactly the names own_buffers() gives, each checked for its dtype and shape.
  virtual StateDict own_buffers() const { return {}; }
  virtual void load_own_buffers(const StateDict& buffers) { (void)buffers; }
  // What parameters_changed() does to this module alone (nothing by default).
  virtual void own_parameters_changed() {}

  // Every module's operator() runs its body through this, so that summary() sees the call: body(inputs...). The
  // inputs (Vars) are checked to be defined first, naming the module.
  template <class Body, class... Inputs> auto traced(Body&& body, const Inputs&... inputs) const {
    check_defined_inputs(type_name_, inputs...);
    return trace_call(*this, std::forward<Body>(body), inputs...);
  }
  // Throws naming this module unless x has at least `min_rank` axes and the last has size `features`.
  void check_input(const Shape& x, std::int64_t features, int min_rank = 1) const;

 private:
  using ParameterSlot = std::variant<Var<float>*, Var<double>*, Var<bf16>*, Var<f16>*>;
  struct OwnParameter {
    std::string name;
    ParameterSlot slot;
    std::optional<ParameterShard> shard;
  };
  void check_new_name(const std::string& name, bool defined) const;
  // `whole`'s block of `shard` (throws naming `what` unless the axis splits into shard.ranks equal blocks).
  template <class P> static Tensor<P> shard_block(const Tensor<P>& whole, const ParameterShard& shard, const std::string& what);

  std::string type_name_;
  Device device_;
  std::vector<OwnParameter> parameters_;
  std::vector<Child> children_;
};

}  // namespace tapegrad::nn
