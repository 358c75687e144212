// What a rank calls a collective with, packed into a Fingerprint that the ranks compare before running it
// (tensor/dist/detail/group.hpp), and described in words when they disagree. Internal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapegrad/tensor/dist/detail/group.hpp"
#include "tapegrad/tensor/shape.hpp"

namespace tapegrad::dist::detail {

enum class Collective : std::int64_t { all_reduce = 1, all_gather, reduce_scatter, broadcast, barrier, split };
std::string_view collective_name(Collective op);

struct Call {
  Collective op = Collective::barrier;
  std::int64_t number = 0;  // the communicator's count of collectives before this one
  bool has_tensor = false;  // barrier and split take none
  bool defined = true;      // an undefined tensor: the rank cannot run the collective
  DType dtype = DType::f32;
  Device::Kind device = Device::Kind::cpu;
  Shape shape;
  int root = -1;  // broadcast's
};

Fingerprint fingerprint_of(const Call& call);
Call call_of(const Fingerprint& fingerprint);
// "all_reduce (call 3) of f32 [4, 3] on cpu"
std::string describe(const Call& call);

// Compares `call` across the group's ranks; when they differ (or one rank's tensor is undefined) throws Error on
// every rank naming the collective and, rank by rank, what each called it with. The group stays usable.
void agree(Group& group, const Call& call);

}  // namespace tapegrad::dist::detail
