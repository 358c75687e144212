// A build without MPI: the API is there, and using it says why it cannot run.
#include "tapegrad/tensor/dist/detail/group.hpp"

namespace tapegrad::dist {

namespace {
[[noreturn]] void throw_without_mpi(const char* op) {
  throw Error(std::string(op) + ": tapegrad was built without MPI (install Open MPI and configure with -Dmpi=enabled)");
}
}  // namespace

Session::Session(int&, char**&) { throw_without_mpi("dist::Session"); }
Session::Session() { throw_without_mpi("dist::Session"); }
Session::~Session() = default;

std::shared_ptr<detail::Group> detail::world_group(const CommunicatorOptions&) {
  throw_without_mpi("dist::Communicator::world");
}

}  // namespace tapegrad::dist
