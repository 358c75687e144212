// A job in which one rank fails, for tests/dist_failures.py: the others must end with an error within seconds.
//   dist_failures hang   the last rank never joins the all_reduce (it sleeps); the others' 2 s timeout throws
//                        CommunicationError, which they print, and the Session ends the job (MPI_Abort, exit 124)
//   dist_failures die    the last rank is killed before the all_reduce; mpirun ends the others
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "tapegrad/tensor/dist/communicator.hpp"

using namespace tapegrad;

int main(int argc, char** argv) {
  dist::Session session(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const auto world = dist::Communicator::world({.timeout = std::chrono::seconds(mode == "hang" ? 2 : 60)});
  Tensor<float> x(Shape{1024});
  if (world.rank() == world.size() - 1) {
    if (mode == "die") std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  try {
    world.all_reduce(x);
    std::printf("rank %d: all_reduce returned without the last rank\n", world.rank());
    return 1;
  } catch (const dist::CommunicationError& e) {
    std::printf("rank %d caught: %s\n", world.rank(), e.what());
  }
  try {
    world.barrier();
  } catch (const dist::CommunicationError& e) {
    std::printf("rank %d then caught: %s\n", world.rank(), e.what());
  }
  std::fflush(stdout);
  return 0;  // the Session aborts the job: a collective is still in flight
}
