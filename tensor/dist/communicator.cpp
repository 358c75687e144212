// The collectives' common steps: the ranks agree on the call (tensor/dist/detail/fingerprint.hpp), the arguments are
// checked (consistently on every rank, since they now agree), then the group runs it on host memory or its GPU link.
#include "tapegrad/tensor/dist/communicator.hpp"

#include <exception>
#include <string>

#include "tapegrad/tensor/dist/detail/fingerprint.hpp"
#include "tapegrad/tensor/dist/detail/group.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "tapegrad/tensor/gpu/detail/side_stream.hpp"

namespace tapegrad::dist {

namespace {

using detail::Call;
using detail::Collective;

// Agrees on the call of `op` with `t` across the group; throws as fingerprint.hpp's agree says.
template <class T> void agree_on(detail::Group& group, Collective op, const Tensor<T>& t, int root = -1) {
  group.throw_if_failed();
  Call call;
  call.op = op;
  call.number = group.next_call();
  call.has_tensor = true;
  call.defined = t.defined();
  call.dtype = dtype_v<T>;
  call.root = root;
  if (t.defined()) {
    call.device = t.device().kind;
    call.shape = t.shape();
  }
  detail::agree(group, call);
}

// Runs this rank's part of `op` once the ranks agreed on it. Should it fail here (out of memory, a CUDA error, a
// capturing stream), the others would wait for this rank: the group fails (Group::abort), so that they throw at once
// with its error (in-process ranks) and this rank cannot start another collective that theirs would meet.
template <class Part> void run_agreed(detail::Group& group, Collective op, Part&& part) {
  try {
    part();
  } catch (const std::exception& e) {
    group.abort(std::string(detail::collective_name(op)) + ": " + e.what());
    throw;
  }
}

// on_host() for a CPU tensor; on_gpu(link, stream) for a CUDA one, on the device's current stream.
template <class OnHost, class OnGpu>
void run_on(detail::Group& group, Collective op, Device device, OnHost&& on_host, OnGpu&& on_gpu) {
  by_device(detail::collective_name(op), device, on_host, [&](auto gpu) {
    on_gpu(group.device_link(gpu.index), cuda::current_stream(gpu.index));
  });
}

template <class T> std::size_t count_of(const Tensor<T>& t) { return static_cast<std::size_t>(t.numel()); }

template <class T> void reduce_into(detail::Group& group, const Tensor<T>& in, Tensor<T>& out) {
  run_on(
      group, Collective::all_reduce, in.device(),
      [&] { group.all_reduce(in.data(), out.data(), count_of(in), dtype_v<T>); },
      [&](detail::DeviceLink& link, cuda::Stream stream) {
        link.all_reduce(in.data(), out.data(), count_of(in), dtype_v<T>, stream);
      });
}

void check_root(const detail::Group& group, int root) {
  check(root >= 0 && root < group.size(), "broadcast", "root ", root, " is not a rank of communicator '",
        group.options().name, "' (", group.size(), " ranks)");
}

template <class T> void broadcast_into(detail::Group& group, Tensor<T>& t, int root) {
  run_on(
      group, Collective::broadcast, t.device(), [&] { group.broadcast(t.data(), count_of(t), dtype_v<T>, root); },
      [&](detail::DeviceLink& link, cuda::Stream stream) {
        link.broadcast(t.data(), count_of(t), dtype_v<T>, root, stream);
      });
}

// A GPU all_reduce on a side stream: waiting makes the current stream wait for it.
class SideStreamRequest final : public detail::Request {
 public:
  explicit SideStreamRequest(int device) : device_(device) {}
  void wait() override {
    if (!waited_) {
      by_device("all_reduce", Device::cuda(device_), [] {}, [](auto gpu) { cuda::SideStream(gpu.index).current_waits(); });
    }
    waited_ = true;
  }

 private:
  int device_;
  bool waited_ = false;
};

}  // namespace

Pending::Pending() = default;
Pending::Pending(std::unique_ptr<detail::Request> request) : request_(std::move(request)) {}
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;
Pending::~Pending() {
  try {
    wait();
  } catch (const Error&) {  // (a destructor cannot report it; the communicator stays failed)
  }
}
void Pending::wait() {
  if (request_) request_->wait();
  request_.reset();
}
void Pending::progress() {
  if (request_) request_->progress();
}

Communicator Communicator::world(const CommunicatorOptions& options) {
  return Communicator(detail::world_group(options));
}

std::vector<Communicator> Communicator::in_process(int size, const CommunicatorOptions& options) {
  std::vector<Communicator> ranks;
  for (auto& group : detail::thread_groups(size, options)) ranks.push_back(Communicator(std::move(group)));
  return ranks;
}

Communicator Communicator::split(int color, int key, const std::string& name) const {
  return Communicator(group_->split(color, key, name));
}

int Communicator::rank() const { return group_->rank(); }
int Communicator::size() const { return group_->size(); }
const std::string& Communicator::name() const { return group_->options().name; }
std::chrono::milliseconds Communicator::timeout() const { return group_->options().timeout; }

template <class T> Tensor<T> Communicator::all_reduce(const Tensor<T>& t) const {
  agree_on(*group_, Collective::all_reduce, t);
  Tensor<T> out;
  run_agreed(*group_, Collective::all_reduce, [&] {
    out = Tensor<T>(t.shape(), t.device());
    reduce_into(*group_, t, out);
  });
  return out;
}

template <class T> void Communicator::all_reduce_in_place(Tensor<T>& t) const {
  agree_on(*group_, Collective::all_reduce, t);
  run_agreed(*group_, Collective::all_reduce, [&] { reduce_into(*group_, t, t); });
}

template <class T> Pending Communicator::all_reduce_start(Tensor<T>& t) const {
  agree_on(*group_, Collective::all_reduce, t);
  Pending pending;
  run_agreed(*group_, Collective::all_reduce, [&] {
    pending = by_device(
        "all_reduce", t.device(),
        [&] { return Pending(group_->start_all_reduce(t.data(), count_of(t), dtype_v<T>)); },
        [&](auto gpu) {
          const cuda::SideStream side(gpu.index);
          side.wait_for_current();
          group_->device_link(gpu.index).all_reduce(t.data(), t.data(), count_of(t), dtype_v<T>, side.stream());
          return Pending(std::make_unique<SideStreamRequest>(gpu.index));
        });
  });
  return pending;
}

template <class T> Tensor<T> Communicator::all_gather(const Tensor<T>& t) const {
  agree_on(*group_, Collective::all_gather, t);
  std::vector<std::int64_t> dims = t.shape().to_vector();
  if (dims.empty()) dims.push_back(1);  // scalars gather into a vector
  dims[0] *= size();
  Tensor<T> out;
  run_agreed(*group_, Collective::all_gather, [&] {
    out = Tensor<T>(Shape(dims), t.device());
    run_on(
        *group_, Collective::all_gather, t.device(),
        [&] { group_->all_gather(t.data(), out.data(), count_of(t), dtype_v<T>); },
        [&](detail::DeviceLink& link, cuda::Stream stream) {
          link.all_gather(t.data(), out.data(), count_of(t), dtype_v<T>, stream);
        });
  });
  return out;
}

template <class T> Tensor<T> Communicator::reduce_scatter(const Tensor<T>& t) const {
  agree_on(*group_, Collective::reduce_scatter, t);
  check(t.rank() >= 1 && t.dim(0) % size() == 0, "reduce_scatter", "the first axis of shape ", t.shape(),
        " must split into ", size(), " equal blocks (one per rank of communicator '", name(), "')");
  std::vector<std::int64_t> dims = t.shape().to_vector();
  dims[0] /= size();
  Tensor<T> out;
  run_agreed(*group_, Collective::reduce_scatter, [&] {
    out = Tensor<T>(Shape(dims), t.device());
    run_on(
        *group_, Collective::reduce_scatter, t.device(),
        [&] { group_->reduce_scatter(t.data(), out.data(), count_of(out), dtype_v<T>); },
        [&](detail::DeviceLink& link, cuda::Stream stream) {
          link.reduce_scatter(t.data(), out.data(), count_of(out), dtype_v<T>, stream);
        });
  });
  return out;
}

template <class T> Tensor<T> Communicator::broadcast(const Tensor<T>& t, int root) const {
  agree_on(*group_, Collective::broadcast, t, root);
  check_root(*group_, root);
  Tensor<T> out;
  run_agreed(*group_, Collective::broadcast, [&] {
    out = rank() == root ? t.clone() : Tensor<T>(t.shape(), t.device());
    broadcast_into(*group_, out, root);
  });
  return out;
}

template <class T> void Communicator::broadcast_in_place(Tensor<T>& t, int root) const {
  agree_on(*group_, Collective::broadcast, t, root);
  check_root(*group_, root);
  run_agreed(*group_, Collective::broadcast, [&] { broadcast_into(*group_, t, root); });
}

void Communicator::barrier() const {
  group_->throw_if_failed();
  Call call;
  call.op = Collective::barrier;
  call.number = group_->next_call();
  detail::agree(*group_, call);
  group_->barrier();
}

#define TAPEGRAD_INSTANTIATE_COLLECTIVES(T)                                  \
  template Tensor<T> Communicator::all_reduce(const Tensor<T>&) const;      \
  template void Communicator::all_reduce_in_place(Tensor<T>&) const;        \
  template Pending Communicator::all_reduce_start(Tensor<T>&) const;        \
  template Tensor<T> Communicator::all_gather(const Tensor<T>&) const;      \
  template Tensor<T> Communicator::reduce_scatter(const Tensor<T>&) const;  \
  template Tensor<T> Communicator::broadcast(const Tensor<T>&, int) const;  \
  template void Communicator::broadcast_in_place(Tensor<T>&, int) const;
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_COLLECTIVES)
TAPEGRAD_INSTANTIATE_COLLECTIVES(std::int32_t)
TAPEGRAD_INSTANTIATE_COLLECTIVES(std::int64_t)
TAPEGRAD_INSTANTIATE_COLLECTIVES(::tapegrad::f8e4m3)
TAPEGRAD_INSTANTIATE_COLLECTIVES(::tapegrad::f8e5m2)

}  // namespace tapegrad::dist
