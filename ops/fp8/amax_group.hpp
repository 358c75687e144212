// The ranks whose amaxes an fp8 op reduces (max) so that all of them quantize with the same scales: a
// tensor-parallel group, as TransformerEngine reduces its amaxes over it. layernorm_mlp makes its group from
// options.tensor_parallel; fp8_dense takes one from its caller (nn::Dense's parallel modes).
//
// Each rank quantizes its own tensors; where a tensor is a shard (a weight's, an activation of this rank's features,
// their gradients) its amax is only this rank's part of the whole one. Reduced:
//   delayed scaling: every amax a pass (the forward; a backward) records is held back until the pass ends, then all
//     of them travel in ONE collective and enter the state as the group's maximum, so that the histories and the
//     scales made from them stay the same on every rank (and equal the unsharded node's);
//   current scaling: a sharded role's amax is reduced before its scale is made (its scale depends on it at once:
//     one small collective per sharded tensor a pass quantizes); a replicated or all-gathered tensor (the same on
//     every rank) is not;
//   block scaling: nothing. Each 1×128 tile and 128×128 block is scaled by its own amax; where a shard's size
//     along a tiled axis is a multiple of 128 (F / p for layernorm_mlp) every tile lies within one rank's shard and
//     its scale is the unsharded node's; other sizes cut the tiles at the shards' edges short, as at a tensor's end.
// The collective is an all_gather of the amaxes, their maximum taken on each rank (a NaN wins, as an infinity would,
// so that every rank refuses the same step). Every rank of the group runs the op together.
#pragma once

#include <array>
#include <initializer_list>
#include <span>
#include <vector>

#include "tapegrad/ops/fp8/roles.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"

namespace tapegrad::fp8 {

struct AmaxGroup {
  dist::Communicator comm;
  // The roles whose tensors differ from rank to rank (shards), by Role: the ones current scaling reduces.
  std::array<bool, role_count> sharded{};

  AmaxGroup(dist::Communicator comm_, std::initializer_list<Role> sharded_roles) : comm(std::move(comm_)) {
    for (Role role : sharded_roles) sharded[static_cast<std::size_t>(role)] = true;
  }
  bool is_sharded(Role role) const { return sharded[static_cast<std::size_t>(role)]; }
};

// Every rank's `amaxes` (the same count on each) reduced to their maximum, element by element, in one collective:
// the same values on every rank. A NaN on any rank gives NaN.
std::vector<float> group_max(const dist::Communicator& comm, std::span<const float> amaxes);

}  // namespace tapegrad::fp8
