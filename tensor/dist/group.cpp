#include "tapegrad/tensor/dist/detail/group.hpp"

#include <atomic>

namespace tapegrad::dist {

// (The library is compiled with TAPEGRAD_HAVE_MPI and TAPEGRAD_HAVE_NCCL where it has them.)
bool has_mpi() {
#ifdef TAPEGRAD_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool has_nccl() {
#ifdef TAPEGRAD_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace tapegrad::dist

namespace tapegrad::dist::detail {

namespace {
std::atomic<bool> failed_in_process{false};
}

void Group::fail(const std::string& what) {
  Group::abort(what);
  throw CommunicationError(failure_);
}

void Group::abort(const std::string& what) {
  if (failure_.empty()) failure_ = "communicator '" + options_.name + "' (rank " + std::to_string(rank_) + " of " +
                                   std::to_string(size_) + "): " + what;
  note_group_failed();
}

void Group::throw_if_failed() const {
  if (!failure_.empty()) throw CommunicationError(failure_ + "; the communicator cannot be used again");
}

namespace {
struct Done final : Request {
  void wait() override {}
};
}  // namespace

std::unique_ptr<Request> Group::start_all_reduce(void* data, std::size_t count, DType dtype) {
  all_reduce(data, data, count, dtype);
  return std::make_unique<Done>();
}

bool any_group_failed() { return failed_in_process.load(); }
void note_group_failed() { failed_in_process.store(true); }

}  // namespace tapegrad::dist::detail
