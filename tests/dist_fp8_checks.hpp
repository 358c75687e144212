// FP8 under tensor parallelism (tests/test_dist_threads.cpp on threads, tests/test_dist_layernorm_mlp.cpp over MPI,
// tests/test_gpu_dist.cpp on GPUs): the sharded node against the unsharded one for every recipe, and delayed scaling's
// amax histories the same on every rank and equal to the unsharded run's.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "dist_mlp_checks.hpp"
#include "fp8_mlp_cases.hpp"

namespace tapegrad::mlp_test {

// The fp8 tests' bounds on the relative error ‖got - want‖ / ‖want‖ between two computations of the same quantized
// products (tests/test_layernorm_mlp_fp8.cpp: the node in f32 against f64): an element that crosses an fp8 rounding
// boundary in one of them moves by a whole fp8 step.
inline constexpr double fp8_forward_bound = 0.03, fp8_gradient_bound = 0.05;

// Every rank's histories (each role's) the same, bitwise.
inline void check_same_on_every_rank(const dist::Communicator& comm, const std::vector<float>& histories) {
  const auto n = static_cast<std::int64_t>(histories.size());
  const Tensor<float> all = comm.all_gather(from_vector<float>(histories, {n}));
  for (int r = 1; r < comm.size(); ++r) {
    CAPTURE(r);
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(all.flat(r * n + i) == all.flat(i));
  }
}

// A sharded run's histories against the unsharded run's: equal for the `exact` roles, whose amax is a maximum over the
// same values however they are split (the kernels, whose shards' maxima make the whole's; the node's h and dy,
// replicated or gathered), within rtol for the others (made by sums over the same terms in another order).
inline void check_histories_match(const std::vector<float>& shard, const std::vector<float>& whole, int length,
                                  double rtol, std::initializer_list<fp8::Role> exact_roles) {
  REQUIRE(shard.size() == whole.size());
  for (fp8::Role role : fp8::roles) {
    const std::string role_name{fp8::role_name(role)};
    CAPTURE(role_name);
    const bool exact = std::find(exact_roles.begin(), exact_roles.end(), role) != exact_roles.end();
    for (int slot = 0; slot < length; ++slot) {
      const std::size_t i = static_cast<std::size_t>(role) * static_cast<std::size_t>(length) + slot;
      CAPTURE(slot);
      if (exact) {
        CHECK(shard[i] == whole[i]);
      } else {
        CHECK(shard[i] == doctest::Approx(whole[i]).epsilon(rtol));
      }
    }
  }
}

// The fp8 node sharded over `comm` against the unsharded one, two steps each (delayed scaling's second quantizes with
// the histories of the first), for every recipe × tensor and sequence parallel × GELU and SwiGLU × a weight cache or
// none, F = 512: each rank's F / p a multiple of 128, so that block scaling's tiles lie within shards. compare(got,
// want, bound) checks each result, bound the fp8 tests' for y and h or for the gradients. Delayed scaling's histories
// and scales are the same on every rank, the histories the unsharded run's; a weight cache made each shard's two copies
// once.
template <class T, class Compare>
void check_sharded_fp8_cases(const dist::Communicator& comm, std::uint64_t seed, Device device, Compare compare,
                             double history_rtol) {
  for (const NamedRecipe& r : fp8_recipes) {
    for (bool sequence : {false, true}) {
      for (Activation act : {Activation::gelu, Activation::swiglu}) {
        for (bool cache : {false, true}) {
          Case c{.options = {.activation = act, .return_layernorm_output = true, .recompute = Recompute::recompute_all},
                 .biases = true};
          c.options.fp8 = fp8_quantization(r.recipe);
          if (cache) c.options.fp8->weight_cache = std::make_shared<fp8::WeightCache>();
          const std::string what = r.name + ", " + describe(c) + (sequence ? ", sequence parallel" : ", tensor parallel") +
                                   (cache ? ", weight cache" : "");
          CAPTURE(what);
          int checked = 0;
          const auto bounded = [&](const Tensor<T>& got, const Tensor<double>& want) {
            compare(got, want, checked++ < 2 ? fp8_forward_bound : fp8_gradient_bound);  // y and h come first
          };
          const ShardedRun run = run_sharded_node<T>(comm, c, sequence, seed, device, bounded, 512, 2);
          if (cache) CHECK(run.shard->weight_cache->copies_made() == 2);
          if (run.shard->state) {
            const auto shard = run.shard->state->snapshot(), whole = run.whole->state->snapshot();
            CHECK(run.shard->state->steps() == 1);
            check_same_on_every_rank(comm, shard.histories);
            using fp8::Role;
            check_histories_match(shard.histories, whole.histories, run.shard->state->recipe().amax_history_len,
                                  history_rtol, {Role::input, Role::kernel1, Role::kernel2, Role::grad_output});
            check_same_on_every_rank(comm, {shard.scales.begin(), shard.scales.end()});
          }
        }
      }
    }
  }
}

}  // namespace tapegrad::mlp_test
