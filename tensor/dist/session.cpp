#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "tapegrad/tensor/dist/detail/group.hpp"

namespace tapegrad::dist {

namespace {
// The exit code of a job ended because a collective failed (as `timeout` uses it).
constexpr int failed_collective_exit_code = 124;

bool start_mpi(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return false;
  int provided = 0;
  const int code = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  check(code == MPI_SUCCESS, "dist::Session", "MPI_Init_thread failed (error ", code, ")");
  return true;
}
}  // namespace

Session::Session(int& argc, char**& argv) : owns_mpi_(start_mpi(&argc, &argv)) {}
Session::Session() : owns_mpi_(start_mpi(nullptr, nullptr)) {}

Session::~Session() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (detail::any_group_failed()) {
    // Open MPI 4.1's mpirun can crash (SIGSEGV in its PMIx log handler) when several ranks call MPI_Abort at once, as
    // every rank that saw the failure would: rank r waits r · 100 ms first, and mpirun usually ends it before then.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::this_thread::sleep_for(std::chrono::milliseconds(100) * std::min(rank, 50));
    MPI_Abort(MPI_COMM_WORLD, failed_collective_exit_code);
  }
  MPI_Finalize();
}

}  // namespace tapegrad::dist
