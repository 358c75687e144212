#include "tapegrad/ops/nn/data_parallel.hpp"

#include <variant>

#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/tensor/any_tensor.hpp"
#include "tapegrad/tensor/factories.hpp"

namespace tapegrad::nn {

struct DataParallel::Bucket {
  std::vector<AnyVar> parameters;
  std::size_t bytes = 0;
  std::size_t ready = 0;  // parameters whose gradient this pass has completed
  bool started = false;
  AnyTensor sums;  // the gradients, flattened and joined, summed over the ranks in place
  dist::Pending pending;
};

DataParallel::DataParallel(const Module& module, dist::Communicator comm, DataParallelOptions options)
    : comm_(std::move(comm)) {
  check(options.bucket_bytes > 0, "DataParallel", "bucket_bytes must be positive");
  const ParameterList parameters = module.parameters();
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    const auto bytes = static_cast<std::size_t>(it->bytes());
    Bucket* last = buckets_.empty() ? nullptr : buckets_.back().get();
    const bool fits = last && last->parameters.front().index() == it->var.index() &&
                      std::visit([](const auto& v) { return v.device(); }, last->parameters.front()) == it->device() &&
                      last->bytes + bytes <= options.bucket_bytes;
    if (!fits) buckets_.push_back(std::make_unique<Bucket>());
    buckets_.back()->parameters.push_back(it->var);
    buckets_.back()->bytes += bytes;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (const AnyVar& parameter : buckets_[b]->parameters) {
      std::visit([&](const auto& v) { hooks_.push_back(std::make_unique<GradientHook>(v, [this, b] { parameter_ready(b); })); },
                 parameter);
    }
  }
}

DataParallel::~DataParallel() = default;

std::size_t DataParallel::started_buckets() const {
  std::size_t started = 0;
  for (const auto& bucket : buckets_) started += bucket->started ? 1 : 0;
  return started;
}

void DataParallel::parameter_ready(std::size_t b) {
  ++buckets_[b]->ready;
  // Buckets start in their order, so that every rank runs the same collectives in the same order whatever order
  // its hooks fire in.
  while (next_to_start_ < buckets_.size() &&
         buckets_[next_to_start_]->ready == buckets_[next_to_start_]->parameters.size()) {
    start(*buckets_[next_to_start_++]);
  }
  for (auto& bucket : buckets_) bucket->pending.progress();
}

void DataParallel::start(Bucket& bucket) {
  std::visit(
      [&](const auto& first) {
        using T = typename std::decay_t<decltype(first.value())>::value_type;
        const NoGradGuard no_grad;
        std::vector<Var<T>> flat;
        for (const AnyVar& parameter : bucket.parameters) {
          const Var<T>& v = std::get<Var<T>>(parameter);
          const Tensor<T> g = v.grad().defined() ? v.grad() : zeros<T>(v.shape(), v.device());
          flat.push_back(constant(g.reshape(Shape{g.numel()})));
        }
        Tensor<T> sums = concat(flat, 0).value();
        bucket.pending = comm_.all_reduce_start(sums);
        bucket.sums = std::move(sums);
      },
      bucket.parameters.front());
  bucket.started = true;
}

void DataParallel::finish_gradients() {
  while (next_to_start_ < buckets_.size()) start(*buckets_[next_to_start_++]);
  next_to_start_ = 0;
  const double scale = 1.0 / comm_.size();
  for (auto& bucket : buckets_) {
    bucket->pending.wait();
    std::visit(
        [&](const auto& first) {
          using T = typename std::decay_t<decltype(first.value())>::value_type;
          const NoGradGuard no_grad;
          const Var<T> average = constant(bucket->sums.get<T>()) * scale;
          std::int64_t offset = 0;
          for (const AnyVar& parameter : bucket->parameters) {
            const Var<T>& v = std::get<Var<T>>(parameter);
            v.slot()->grad = slice(average, 0, offset, offset + v.numel()).value().reshape(v.shape());
            offset += v.numel();
          }
        },
        bucket->parameters.front());
    bucket->sums = {};
    bucket->ready = 0;
    bucket->started = false;
  }
}

void broadcast_parameters(Module& module, const dist::Communicator& comm, int root) {
  for (const NamedParameter& parameter : module.parameters()) {
    std::visit(
        [&](const auto& v) {
          auto value = v.value();  // (shares the parameter's storage: the broadcast writes into it)
          comm.broadcast_in_place(value, root);
        },
        parameter.var);
  }
  module.parameters_changed();
}

}  // namespace tapegrad::nn
