// The GPU links of a group (tensor/dist/detail/group.hpp): an NCCL communicator on one device (in a build without
// NCCL, an Error saying so), or the group's host collectives on copies staged through host memory. Internal.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "tapegrad/tensor/dist/detail/group.hpp"

namespace tapegrad::dist::detail {

// Collective over `group`: rank 0 makes NCCL's id and `share_id(bytes, size)` broadcasts it to the other ranks.
std::unique_ptr<DeviceLink> make_nccl_link(Group& group, int device,
                                           const std::function<void(void*, std::size_t)>& share_id);

// Each collective waits for its stream, copies the tensor to the host, runs `group`'s host collective (its timeout,
// errors and rounding) and copies the result back on the stream, waiting for the copy (tensor/dist/staged_link.cpp).
// For ranks of one process that share a GPU (stage_through_host), which NCCL refuses; needs no NCCL.
std::unique_ptr<DeviceLink> make_staged_link(Group& group, int device);

}  // namespace tapegrad::dist::detail
