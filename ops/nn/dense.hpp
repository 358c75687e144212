// nn::Dense: a linear layer contracting the last axis (flax's Dense / DenseGeneral with axis = -1):
// x [..., in] · kernel [in, features] + bias [features] -> [..., features].
//
//   nn::Dense<f32, bf16> proj(128, {.features = 512}, /*seed=*/0);  // f32 kernel and bias, computes in bf16
//   Var<bf16> y = proj(x);  // x [..., 128] in any dtype -> bf16 [..., 512]
//
// With an fp8 recipe (`.fp8 = fp8::DelayedScaling{}`) the projection is fp8_dense (ops/fp8/dense.hpp): its products
// read FP8 values, the kernel quantized from P itself; the module owns delayed scaling's state. With tensor
// parallelism too, each rank quantizes its own shard (and caches its own copy) with the amaxes reduced over the
// ranks (ops/fp8/amax_group.hpp), so that every rank's state and scales are the same.
//
// With `.tensor_parallel` each rank holds a shard of the kernel (Megatron-LM's parallel linear layers,
// TransformerEngine's parallel_mode) and the module runs the collectives of ops/dist.hpp around its product:
//   column: kernel [in, F/p] and bias [F/p]; x replicated (all-gathered over its first axis with sequence_parallel),
//           the output this rank's F/p features.
//   row:    kernel [in/p, F], bias replicated; x this rank's in/p features; the partial products all-reduced
//           (reduce-scattered over the first axis with sequence_parallel), then the bias added.
// Every rank calls the module together; gradients are the shard's own and the replicated parameters' whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/dist.hpp"
#include "tapegrad/ops/fp8/dense.hpp"
#include "tapegrad/ops/nn/detail/fp8_module.hpp"
#include "tapegrad/ops/nn/dtypes.hpp"
#include "tapegrad/ops/nn/module.hpp"

namespace tapegrad::nn {

struct DenseConfig {
  std::int64_t features = 0;  // the output size; must be set (> 0)
  bool use_bias = true;
  Initializer kernel_init = Initializer::lecun_normal();  // fan_in = in
  Initializer bias_init = Initializer::zeros();
  std::optional<fp8::Recipe> fp8{};  // none: an unquantized product; the module owns delayed scaling's state
  // With fp8: keep the kernel's fp8 copy from forward to forward (micro-batches, ops/fp8/weight_cache.hpp) until
  // the module's parameters_changed().
  bool fp8_weight_cache = false;
  std::optional<TensorParallel> tensor_parallel{};  // none: one process holds the whole projection
  enum class Parallel { column, row } parallel = Parallel::column;
};

// x [..., in] · kernel [in, F] (+ bias [F] when defined), in U.
template <class U> Var<U> dense(const Var<U>& x, const Var<U>& kernel, const Var<U>& bias);

namespace detail {
// The projection's parameters, registered in `owner` as `kernel` and `bias`.
template <class P> struct DenseParameters {
  Var<P> kernel, bias;  // bias undefined without use_bias
  std::optional<Fp8Quantization> fp8;
  std::optional<TensorParallel> parallel;
  DenseConfig::Parallel mode;

  DenseParameters(Module& owner, std::int64_t in, const DenseConfig& config, std::uint64_t seed)
      : parallel(config.tensor_parallel), mode(config.parallel) {
    check(in > 0 && config.features > 0, owner.type_name(), "input size and features must be positive, got ", in,
          " and ", config.features);
    const bool column = mode == DenseConfig::Parallel::column;
    owner.init_parameter("kernel", kernel, config.kernel_init, {in, config.features}, seed, {},
                         shard_along(owner, column ? 1 : 0, column ? config.features : in));
    if (config.use_bias) {
      owner.init_parameter("bias", bias, config.bias_init, {config.features}, seed, {},
                           column ? shard_along(owner, 0, config.features) : std::nullopt);
    }
    fp8 = module_fp8(config.fp8, config.fp8_weight_cache);
  }
  // x is already in the compute dtype U; the parameters are rounded to it (with fp8: the kernel quantized from P).
  template <class U> Var<U> apply(const Var<U>& x) const {
    const Var<U> b = bias.defined() ? cast<U>(bias) : Var<U>();
    // This rank's product, with the bias or without.
    const auto product = [&](const Var<U>& in, bool with_bias) {
      if (fp8) return fp8_dense(in, kernel, with_bias ? bias : Var<P>(), *fp8, amax_group());
      return dense(in, cast<U>(kernel), with_bias ? b : Var<U>());
    };
    if (!parallel) return product(x, true);
    const dist::Communicator& comm = parallel->comm;
    const bool sequence = parallel->sequence_parallel;
    if (mode == DenseConfig::Parallel::column) {
      return product(sequence ? dist::all_gather(comm, x) : dist::replicate(comm, x), true);
    }
    const Var<U> partial = product(x, false);
    const Var<U> summed = sequence ? dist::reduce_scatter(comm, partial) : dist::all_reduce(comm, partial);
    if (!b.defined()) return summed;
    return summed + (sequence ? dist::replicate(comm, b) : b);  // rows of this rank only: the bias's gradient summed
  }
  const fp8::ScalingState* fp8_state() const { return fp8 ? fp8->state.get() : nullptr; }
  // The input size the module takes (a row-parallel shard's).
  std::int64_t in() const { return kernel.shape()[0]; }

 private:
  // With fp8 and tensor parallelism, the ranks' amaxes reduced: the kernel's shard and, column-parallel, dy (this
  // rank's features), row-parallel x (this rank's features) differ from rank to rank; the other of x and dy is
  // replicated or all-gathered.
  std::optional<fp8::AmaxGroup> amax_group() const {
    if (!parallel) return std::nullopt;
    using fp8::Role;
    const Role other = mode == DenseConfig::Parallel::column ? Role::grad_output : Role::input;
    return fp8::AmaxGroup(parallel->comm, {Role::kernel1, other});
  }

  std::optional<ParameterShard> shard_along(const Module& owner, int axis, std::int64_t size) const {
    if (!parallel) return std::nullopt;
    const int ranks = parallel->comm.size();
    check(size % ranks == 0, owner.type_name(), "a ", mode == DenseConfig::Parallel::column ? "column" : "row",
          "-parallel projection splits ", size, " over ", ranks, " ranks: not a multiple");
    return ParameterShard{axis, parallel->comm.rank(), ranks};
  }
};
}  // namespace detail

template <class P, class C = void>
  requires ModuleDtypes<P, C>
class Dense : public Module {
 public:
  Dense(std::int64_t in_features, const DenseConfig& config, std::uint64_t seed, Device device = Device::cpu())
      : Module("Dense", device), dense_(*this, in_features, config, seed) {}

  // x [..., in] in any dtype -> [..., features] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x) const {
    return traced(
        [this](const Var<T>& x) {
          check_input(x.shape(), dense_.in());
          return dense_.apply(cast<compute_of<C, T>>(x));
        },
        x);
  }

  const Var<P>& kernel() const { return dense_.kernel; }
  const Var<P>& bias() const { return dense_.bias; }
  // Delayed scaling's amax histories and scales, which every call advances (null for other recipes and without fp8).
  const fp8::ScalingState* fp8_state() const { return dense_.fp8_state(); }
  std::vector<std::string> summary_notes() const override { return detail::fp8_notes(dense_.fp8); }

 protected:
  StateDict own_buffers() const override { return detail::fp8_buffers(dense_.fp8); }
  void load_own_buffers(const StateDict& buffers) override { detail::load_fp8_buffers(dense_.fp8, buffers); }
  void own_parameters_changed() override { detail::clear_fp8_weight_cache(dense_.fp8); }

 private:
  detail::DenseParameters<P> dense_;
};

}  // namespace tapegrad::nn
