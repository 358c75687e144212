// Training the LayerNorm-MLP block over several processes: tensor parallel (each rank holds a shard of the FFN
// dimension), tensor + sequence parallel (each rank also holds its own rows of the batch), or data parallel (each
// rank the whole module and its own rows). Every form trains the same block on the same data from the same start,
// so the losses match the one-process run (-np 1) to rounding.
//
//   mpirun -np 2 ./build/examples/distributed [tensor|sequence|data]    (default tensor)
#include <cstdio>
#include <string>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

namespace {

constexpr std::int64_t rows = 16, hidden = 32, ffn = 64;
constexpr int steps = 30;

// Rank r's block of `t` along `axis`, of `parts`.
Tensor<double> block_of(const Tensor<double>& t, int axis, int r, int parts) {
  const std::int64_t size = t.dim(axis) / parts;
  return slice(constant(t), axis, r * size, (r + 1) * size).value();
}

// The loss of the whole batch from this rank's part of it (each rank's rows' share of the mean square error).
double whole_loss(const dist::Communicator& world, const Var<double>& loss, bool rows_sharded) {
  return rows_sharded ? world.all_reduce(loss.value()).item() : loss.value().item();
}

void train_sharded(const dist::Communicator& world, bool sequence) {
  const int p = world.size(), r = world.rank();
  // Every rank makes the whole block from one seed and keeps its shard: W1's and b1's columns, W2's rows.
  const Var<double> gamma = param(randn<double>({hidden}, 1, 1.0, 0.1)), beta = param(zeros<double>({hidden}));
  const Var<double> w1 = param(block_of(randn<double>({hidden, 1, ffn}, 2, 0.0, 0.2), 2, r, p));
  const Var<double> b1 = param(block_of(zeros<double>({1, ffn}), 1, r, p));
  const Var<double> w2 = param(block_of(randn<double>({ffn, hidden}, 3, 0.0, 0.1), 0, r, p));
  const Var<double> b2 = param(zeros<double>({hidden}));
  const Tensor<double> x = randn<double>({rows, hidden}, 4), target = randn<double>({rows, hidden}, 5, 0.0, 0.5);
  const Var<double> xs = constant(sequence ? block_of(x, 0, r, p) : x);
  const Var<double> ts = constant(sequence ? block_of(target, 0, r, p) : target);
  const LayerNormMLPOptions options{.activation = Activation::gelu, .tensor_parallel = TensorParallel{world, sequence}};
  optim::SGD sgd(std::vector<nn::AnyVar>{gamma, beta, w1, b1, w2, b2}, {.lr = 0.1});
  for (int step = 0; step < steps; ++step) {
    const Var<double> y = layernorm_mlp(xs, gamma, beta, {w1, w2}, {b1, b2}, options).y;
    // Each rank's loss is its rows' share of the whole batch's mean (all of it when the rows are not sharded).
    const Var<double> loss = sum(square(y - ts)) * (1.0 / double(rows * hidden));
    backward(loss);
    sgd.step();
    sgd.zero_grad();
    const double whole = whole_loss(world, loss, sequence);
    if (r == 0 && (step % 10 == 0 || step == steps - 1)) std::printf("step %2d  loss %.12f\n", step, whole);
    Tape::active().clear();
  }
}

void train_data_parallel(const dist::Communicator& world) {
  const int p = world.size(), r = world.rank();
  nn::LayerNormMLP<double> model(hidden, {.intermediate_dim = ffn}, 6 + static_cast<std::uint64_t>(r));
  nn::broadcast_parameters(model, world);  // rank 0's start everywhere
  nn::DataParallel ddp(model, world);
  optim::SGD sgd(model.parameters(), {.lr = 0.1});
  const Tensor<double> x = randn<double>({rows, hidden}, 4), target = randn<double>({rows, hidden}, 5, 0.0, 0.5);
  const Var<double> xs = constant(block_of(x, 0, r, p)), ts = constant(block_of(target, 0, r, p));
  for (int step = 0; step < steps; ++step) {
    const Var<double> loss = mse_loss(model(xs), ts);  // the mean over this rank's rows
    backward(loss);
    ddp.finish_gradients();  // the ranks' average: the gradient of the whole batch's mean
    sgd.step();
    sgd.zero_grad();
    const double whole = whole_loss(world, loss, true) / p;
    if (r == 0 && (step % 10 == 0 || step == steps - 1)) std::printf("step %2d  loss %.12f\n", step, whole);
    Tape::active().clear();
  }
}

}  // namespace

int main(int argc, char** argv) {
  dist::Session session(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "tensor";
  const auto world = dist::Communicator::world();
  if (world.rank() == 0) std::printf("%s parallel over %d ranks\n", mode.c_str(), world.size());
  if (mode == "tensor" || mode == "sequence") {
    train_sharded(world, mode == "sequence");
  } else if (mode == "data") {
    train_data_parallel(world);
  } else {
    if (world.rank() == 0) std::fprintf(stderr, "usage: distributed [tensor|sequence|data]\n");
    return 2;
  }
}
