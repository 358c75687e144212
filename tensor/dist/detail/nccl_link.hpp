// The GPU link of a group (tensor/dist/detail/group.hpp): an NCCL communicator on one device, or, in a build without
// NCCL, an Error saying so. Internal.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "tapegrad/tensor/dist/detail/group.hpp"

namespace tapegrad::dist::detail {

// Collective over `group`: rank 0 makes NCCL's id and `share_id(bytes, size)` broadcasts it to the other ranks.
std::unique_ptr<DeviceLink> make_nccl_link(Group& group, int device,
                                           const std::function<void(void*, std::size_t)>& share_id);

}  // namespace tapegrad::dist::detail
