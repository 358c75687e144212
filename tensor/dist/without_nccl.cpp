// A build without NCCL (or without CUDA): CUDA tensors have no collectives.
#include "tapegrad/tensor/dist/detail/nccl_link.hpp"

namespace tapegrad::dist::detail {

std::unique_ptr<DeviceLink> make_nccl_link(Group&, int device, const std::function<void(void*, std::size_t)>&) {
  throw Error("dist: collectives of tensors on cuda:" + std::to_string(device) +
              " need NCCL, and tapegrad was built without it (configure with -Dnccl=enabled where nccl.h is)");
}

}  // namespace tapegrad::dist::detail
