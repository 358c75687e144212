// layernorm_mlp's tensor parallelism against the unsharded node, on any communicator and device
// (tests/test_dist_layernorm_mlp.cpp over MPI, tests/test_dist_threads.cpp on threads, tests/test_gpu_dist.cpp on a
// GPU): y and every gradient of the sharded node equal to the unsharded node's on the whole block.
#pragma once

#include <doctest/doctest.h>

#include "mlp_cases.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::mlp_test {

// |sharded - unsharded| on the CPU within these: the sums over the ranks' partial products round in another order.
template <class T> test::Tolerance cpu_sharding_tolerance() {
  return std::is_same_v<T, double> ? test::Tolerance{1e-11, 1e-11, true} : test::Tolerance{2e-5, 2e-5, true};
}

// Rank r's block of `t` along `axis`, of `parts` equal blocks.
template <class T> Tensor<T> block_of(const Tensor<T>& t, int axis, int r, int parts) {
  const std::int64_t size = t.dim(axis) / parts;
  return slice(constant(t), axis, r * size, (r + 1) * size).value();
}
template <class T> Var<T> param_block(const Var<T>& v, int axis, int r, int parts) {
  return v.defined() ? param(block_of(v.value(), axis, r, parts)) : Var<T>();
}
template <class T> Tensor<double> block_of_grad(const Var<T>& v, int axis, int r, int parts) {
  return cast<double>(block_of(v.grad(), axis, r, parts).to(Device::cpu()));
}
template <class T> Tensor<double> on_cpu(const Tensor<T>& t) { return cast<double>(t.to(Device::cpu())); }

// The quantizations a run of the sharded and the unsharded node used (fp8: each its own, fresh; none without).
struct ShardedRun {
  std::optional<Fp8Quantization> whole, shard;
};

// A fresh quantization of q's recipe (its own state and cache), so that two nodes do not share one.
inline std::optional<Fp8Quantization> fresh(const std::optional<Fp8Quantization>& q) {
  if (!q) return std::nullopt;
  Fp8Quantization out = fp8_quantization(q->recipe);
  if (q->weight_cache) out.weight_cache = std::make_shared<fp8::WeightCache>();
  return out;
}

// The sharded node of case c (F the whole ffn size, a multiple of 4) against the unsharded one on the whole block,
// each run for `steps` steps (forward and backward) with its own quantization; compare(got, want) checks the last
// step's y, h and every gradient (got on x's device, want in double on the host).
template <class T, class Compare>
ShardedRun run_sharded_node(const dist::Communicator& world, const Case& c, bool sequence, std::uint64_t seed,
                            Device device, Compare compare, std::int64_t F = 24, int steps = 1) {
  const int p = world.size(), r = world.rank();
  const std::int64_t M = 8, H = 16;  // M and F split over 1, 2 and 4 ranks
  Params<T> whole = make_params<T>(c, H, F, seed);
  for (Var<T>* v : {&whole.gamma, &whole.beta, &whole.w1, &whole.b1, &whole.w2, &whole.b2}) {
    if (v->defined()) *v = param(v->value().to(device));
  }
  const Tensor<T> xv = randn<T>({2, M / 2, H}, seed + 10, 0.2, 1.3).to(device);
  const Tensor<T> dy = randn<T>({2, M / 2, H}, seed + 11).to(device), dh = randn<T>({2, M / 2, H}, seed + 12).to(device);
  auto loss_of = [&](const LayerNormMLPOutput<T>& out, const Tensor<T>& dy_part, const Tensor<T>& dh_part) {
    Var<T> loss = sum(out.y * constant(dy_part));
    if (out.layernorm_output.defined()) loss = loss + sum(out.layernorm_output * constant(dh_part));
    return loss;
  };

  // The unsharded node on the whole block (every rank computes it alike).
  const Var<T> x_all = param(xv);
  ShardedRun run{fresh(c.options.fp8), fresh(c.options.fp8)};
  LayerNormMLPOptions whole_options = c.options;
  whole_options.fp8 = run.whole;
  const auto zero_grads = [](const Params<T>& params, const Var<T>& x) {
    for (Var<T> v : defined_params(params)) v.zero_grad();
    Var<T>(x).zero_grad();
  };
  LayerNormMLPOutput<T> want;
  for (int step = 0; step < steps; ++step) {
    zero_grads(whole, x_all);
    want = node(x_all, whole, whole_options);
    backward(loss_of(want, dy, dh));
  }

  // This rank's shard: W1's and b1's columns, W2's rows; with sequence parallelism x's rows (flattened [M, H]).
  Params<T> shard = whole;
  shard.w1 = param_block(whole.w1, 2, r, p);
  shard.b1 = param_block(whole.b1, 1, r, p);
  shard.w2 = param_block(whole.w2, 0, r, p);
  for (Var<T>* v : {&shard.gamma, &shard.beta, &shard.b2}) {
    if (v->defined()) *v = param(v->value());
  }
  auto rows = [&](const Tensor<T>& t) {
    return sequence ? block_of(t.reshape(Shape{M, H}), 0, r, p) : t;
  };
  const Var<T> x = param(rows(xv));
  LayerNormMLPOptions options = c.options;
  options.fp8 = run.shard;
  options.tensor_parallel = TensorParallel{world, sequence};
  LayerNormMLPOutput<T> got;
  for (int step = 0; step < steps; ++step) {
    zero_grads(shard, x);
    got = node(x, shard, options);
    backward(loss_of(got, rows(dy), rows(dh)));
  }

  const auto check = [&](const Tensor<T>& g, const Tensor<double>& w) { compare(g.to(Device::cpu()), w); };
  check(got.y.value(), on_cpu(rows(want.y.value())));
  if (c.options.return_layernorm_output) check(got.layernorm_output.value(), on_cpu(rows(want.layernorm_output.value())));
  check(x.grad(), on_cpu(rows(x_all.grad())));
  check(shard.w1.grad(), block_of_grad(whole.w1, 2, r, p));
  check(shard.w2.grad(), block_of_grad(whole.w2, 0, r, p));
  check(shard.gamma.grad(), on_cpu(whole.gamma.grad()));
  if (c.biases) {
    check(shard.b1.grad(), block_of_grad(whole.b1, 1, r, p));
    check(shard.b2.grad(), on_cpu(whole.b2.grad()));
  }
  if (c.has_beta()) check(shard.beta.grad(), on_cpu(whole.beta.grad()));
  Tape::active().clear();
  return run;
}

template <class T> void check_sharded_node(const dist::Communicator& world, const Case& c, bool sequence,
                                           std::uint64_t seed, Device device, test::Tolerance tol) {
  run_sharded_node<T>(world, c, sequence, seed, device,
                      [&](const Tensor<T>& got, const Tensor<double>& want) { test::check_close(got, want, tol); });
}

// Calls check_sharded_node for both norms × gelu and swiglu × biases × recompute policies × returning h, tensor
// parallel and sequence parallel; half of them with the residual (rank 0's under tensor parallelism, each rank's rows
// under sequence parallelism), with and without biases.
template <class T> void check_sharded_cases(const dist::Communicator& world, std::uint64_t seed, Device device,
                                           test::Tolerance tol) {
  for (bool sequence : {false, true}) {
    for (Activation act : {Activation::gelu, Activation::swiglu}) {
      for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
        for (bool biases : {true, false}) {
          for (Recompute policy : all_policies) {
            for (bool return_h : {false, true}) {
              const Case c{.options = {.norm = norm, .activation = act, .return_layernorm_output = return_h,
                                       .residual = return_h != biases, .recompute = policy},
                           .biases = biases};
              const std::string what = describe(c) + (sequence ? ", sequence parallel" : ", tensor parallel");
              CAPTURE(what);
              check_sharded_node<T>(world, c, sequence, seed, device, tol);
            }
          }
        }
      }
    }
  }
}

}  // namespace tapegrad::mlp_test
