#include "tapegrad/ops/dist.hpp"

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/ops/layout.hpp"

namespace tapegrad::dist {

namespace {
struct NoSaved {};

// A node whose forward runs `forward(comm, x)`, its backward `backward(comm, dy)` and, recorded (create_graph),
// `recorded(comm, dy)` of the collective ops below.
template <class T, class Forward, class Backward, class Recorded>
Var<T> collective_node(const char* name, const Communicator& comm, const Var<T>& x, Forward forward,
                       Backward backward, Recorded recorded) {
  return custom_op<NoSaved>(
      name, [&](NoSaved&, const Tensor<T>& value) { return forward(comm, value); },
      [comm, backward](const NoSaved&, const NeedsGrad&, const Tensor<T>& dy) { return backward(comm, dy); },
      graph_backward([comm, recorded](const NoSaved&, const NeedsGrad&, const std::tuple<Var<T>>&, const Var<T>& dy) {
        return recorded(comm, dy);
      }),
      x);
}

template <class T> Tensor<T> same(const Communicator&, const Tensor<T>& t) { return t; }
template <class T> Tensor<T> summed(const Communicator& comm, const Tensor<T>& t) { return comm.all_reduce(t); }
template <class T> Tensor<T> gathered(const Communicator& comm, const Tensor<T>& t) { return comm.all_gather(t); }
template <class T> Tensor<T> scattered(const Communicator& comm, const Tensor<T>& t) {
  return comm.reduce_scatter(t);
}
}  // namespace

template <class T> Var<T> replicate(const Communicator& comm, const Var<T>& x) {
  return collective_node("dist::replicate", comm, x, same<T>, summed<T>,
                         [](const Communicator& c, const Var<T>& dy) { return all_reduce(c, dy); });
}
template <class T> Var<T> all_reduce(const Communicator& comm, const Var<T>& x) {
  // Recorded, the identity is replicate: the backward uses dy rank by rank (sharded), so a derivative through it
  // sums the ranks' parts, as replicate's and all_reduce's backwards are each other's.
  return collective_node("dist::all_reduce", comm, x, summed<T>, same<T>,
                         [](const Communicator& c, const Var<T>& dy) { return replicate(c, dy); });
}
template <class T> Var<T> all_gather(const Communicator& comm, const Var<T>& x) {
  check_defined(x, "dist::all_gather", "x");
  // (A gathered scalar is a vector [size]: its gradient scatters back into one element, shaped as x.)
  const Shape shape = x.shape();
  return collective_node(
      "dist::all_gather", comm, x, gathered<T>,
      [shape](const Communicator& c, const Tensor<T>& dy) { return c.reduce_scatter(dy).reshape(shape); },
      [shape](const Communicator& c, const Var<T>& dy) { return reshape(reduce_scatter(c, dy), shape.to_vector()); });
}
template <class T> Var<T> reduce_scatter(const Communicator& comm, const Var<T>& x) {
  return collective_node("dist::reduce_scatter", comm, x, scattered<T>, gathered<T>,
                         [](const Communicator& c, const Var<T>& dy) { return all_gather(c, dy); });
}

#define TAPEGRAD_INSTANTIATE_DIST_OPS(T)                                      \
  template Var<T> replicate(const Communicator&, const Var<T>&);              \
  template Var<T> all_reduce(const Communicator&, const Var<T>&);             \
  template Var<T> all_gather(const Communicator&, const Var<T>&);             \
  template Var<T> reduce_scatter(const Communicator&, const Var<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_DIST_OPS)

}  // namespace tapegrad::dist
