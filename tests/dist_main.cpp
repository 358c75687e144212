// main() of the tests that run under mpirun: MPI for the process's lifetime around doctest. Every rank runs every
// test case (collectives need all of them) and reports its own failures.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tapegrad/tensor/dist/communicator.hpp"

int main(int argc, char** argv) {
  tapegrad::dist::Session session(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
