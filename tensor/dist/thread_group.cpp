// The in-process transport: the ranks are threads of one process sharing a Rendezvous. A collective is two meetings:
// at the first each rank posts its buffers, then every rank computes its own result from all of them (sums in rank
// order, so every rank gets the same bits); at the second they agree that everyone is done reading. A meeting that
// a rank misses for the timeout fails the group, naming the ranks that never came.
//
// CUDA tensors go over NCCL when every rank is on its own GPU. NCCL refuses two ranks on one GPU, so when any two
// share one (a test on a machine of one GPU) every rank's CUDA collectives are staged through these host
// collectives instead (tensor/dist/staged_link.cpp); the ranks compare their devices when the link is made.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "tapegrad/tensor/dist/detail/fingerprint.hpp"
#include "tapegrad/tensor/dist/detail/group.hpp"
#include "tapegrad/tensor/dist/detail/nccl_link.hpp"
#include "tapegrad/tensor/dtype.hpp"

namespace tapegrad::dist::detail {

namespace {

// What the ranks share: one slot per rank, and a count of meetings so far.
struct Rendezvous {
  explicit Rendezvous(int size) : posted(static_cast<std::size_t>(size)), arrived(static_cast<std::size_t>(size)) {}
  struct Post {
    const void* in = nullptr;
    void* out = nullptr;
    Fingerprint fingerprint{};
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Post> posted;
  std::vector<std::int64_t> arrived;  // per rank: the meetings it has come to
  std::int64_t meetings_done = 0;     // meetings every rank has come to
  std::int64_t broken = 0;            // set when a rank gave up waiting: every meeting after fails at once
};

template <class T> void add_into(void* out, const void* in, std::size_t count) {
  auto* o = static_cast<T*>(out);
  const auto* a = static_cast<const T*>(in);
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (is_half_precision_v<T> || is_fp8_v<T>) {  // added in f32, rounded to T (as MPI's and NCCL's)
      o[i] = convert<T>(convert<float>(o[i]) + convert<float>(a[i]));
    } else {
      o[i] += a[i];
    }
  }
}

void add_into(DType dtype, void* out, const void* in, std::size_t count) {
  switch (dtype) {
    case DType::f32: return add_into<float>(out, in, count);
    case DType::f64: return add_into<double>(out, in, count);
    case DType::bf16: return add_into<bf16>(out, in, count);
    case DType::f16: return add_into<f16>(out, in, count);
    case DType::i32: return add_into<std::int32_t>(out, in, count);
    case DType::i64: return add_into<std::int64_t>(out, in, count);
    case DType::f8e4m3: return add_into<f8e4m3>(out, in, count);
    case DType::f8e5m2: return add_into<f8e5m2>(out, in, count);
  }
}

class ThreadGroup final : public Group {
 public:
  ThreadGroup(std::shared_ptr<Rendezvous> shared, int rank, int size, const CommunicatorOptions& options)
      : Group(rank, size, options), shared_(std::move(shared)) {}

  std::vector<Fingerprint> disagreement(const Fingerprint& mine) override {
    std::vector<Fingerprint> all;
    exchange(describe(call_of(mine)), {.fingerprint = mine}, [&](const std::vector<Rendezvous::Post>& posts) {
      for (const auto& post : posts) all.push_back(post.fingerprint);
    });
    for (const auto& f : all) {
      if (f != mine) return all;
    }
    return {};
  }

  void all_reduce(const void* in, void* out, std::size_t count, DType dtype) override {
    // Each rank sums every rank's input in rank order into a scratch copy, then writes it out (out may be in).
    std::vector<unsigned char> sum(count * dtype_size(dtype));
    exchange("all_reduce", {.in = in}, [&](const std::vector<Rendezvous::Post>& posts) {
      std::memcpy(sum.data(), posts[0].in, sum.size());
      for (std::size_t r = 1; r < posts.size(); ++r) add_into(dtype, sum.data(), posts[r].in, count);
    });
    std::memcpy(out, sum.data(), sum.size());
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    const std::size_t bytes = count * dtype_size(dtype);
    exchange("all_gather", {.in = in}, [&](const std::vector<Rendezvous::Post>& posts) {
      for (std::size_t r = 0; r < posts.size(); ++r) {
        std::memcpy(static_cast<unsigned char*>(out) + r * bytes, posts[r].in, bytes);
      }
    });
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype) override {
    const std::size_t offset = static_cast<std::size_t>(rank()) * count * dtype_size(dtype);
    exchange("reduce_scatter", {.in = in}, [&](const std::vector<Rendezvous::Post>& posts) {
      std::memcpy(out, static_cast<const unsigned char*>(posts[0].in) + offset, count * dtype_size(dtype));
      for (std::size_t r = 1; r < posts.size(); ++r) {
        add_into(dtype, out, static_cast<const unsigned char*>(posts[r].in) + offset, count);
      }
    });
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    exchange("broadcast", {.in = data}, [&](const std::vector<Rendezvous::Post>& posts) {
      if (rank() != root) std::memcpy(data, posts[static_cast<std::size_t>(root)].in, count * dtype_size(dtype));
    });
  }
  void barrier() override {
    exchange("barrier", {}, [](const std::vector<Rendezvous::Post>&) {});
  }

  std::shared_ptr<Group> split(int, int, const std::string&) override {
    throw Error("split: communicators of threads in one process (Communicator::in_process) cannot be split; make "
                "another set with in_process");
  }

  DeviceLink& device_link(int device) override {
    throw_if_failed();
    auto& link = links_[device];
    if (!link) {
      std::vector<int> devices;
      exchange("compare the ranks' GPUs", {.in = &device}, [&](const std::vector<Rendezvous::Post>& posts) {
        for (const auto& post : posts) devices.push_back(*static_cast<const int*>(post.in));
      });
      if (stage_through_host(devices)) {
        link = make_staged_link(*this, device);
      } else {
        link = make_nccl_link(*this, device, [&](void* id, std::size_t bytes) {
          broadcast(id, bytes, DType::f8e4m3, 0);  // (as bytes: a one-byte dtype)
        });
      }
    }
    return *link;
  }

 private:
  // Meets the other ranks with `post`, runs `read(posts)` while every rank's post is valid, and meets them again.
  template <class Read> void exchange(const std::string& what, const Rendezvous::Post& post, Read&& read) {
    throw_if_failed();
    Rendezvous& s = *shared_;
    std::unique_lock lock(s.mutex);
    s.posted[static_cast<std::size_t>(rank())] = post;
    meet(lock, what);
    const std::vector<Rendezvous::Post> posts = s.posted;  // (nobody posts again before the second meeting)
    lock.unlock();
    read(posts);
    lock.lock();
    meet(lock, what);
  }

  // Waits, with the lock held, until every rank has come to this rank's next meeting.
  void meet(std::unique_lock<std::mutex>& lock, const std::string& what) {
    Rendezvous& s = *shared_;
    const std::int64_t meeting = ++s.arrived[static_cast<std::size_t>(rank())];
    const auto everyone_came = [&] {
      for (const std::int64_t a : s.arrived) {
        if (a < meeting) return false;
      }
      return true;
    };
    s.changed.notify_all();
    if (s.changed.wait_for(lock, options().timeout, [&] { return s.broken || everyone_came(); }) && !s.broken) {
      return;
    }
    std::ostringstream missing;
    for (std::size_t r = 0; r < s.arrived.size(); ++r) {
      if (s.arrived[r] < meeting) missing << (missing.tellp() > 0 ? ", " : "") << r;
    }
    s.broken = 1;
    s.changed.notify_all();
    lock.unlock();
    fail(what + ": " + (missing.tellp() > 0 ? "rank(s) " + missing.str() + " did not come within the timeout"
                                              : "another rank gave up waiting"));
  }

  std::shared_ptr<Rendezvous> shared_;
  std::map<int, std::unique_ptr<DeviceLink>> links_;
};

}  // namespace

bool stage_through_host(std::span<const int> devices) {
  std::vector<int> sorted(devices.begin(), devices.end());
  std::ranges::sort(sorted);
  return std::ranges::adjacent_find(sorted) != sorted.end();
}

std::vector<std::shared_ptr<Group>> thread_groups(int size, const CommunicatorOptions& options) {
  check(size >= 1, "dist::Communicator::in_process", "size must be at least 1, got ", size);
  auto shared = std::make_shared<Rendezvous>(size);
  std::vector<std::shared_ptr<Group>> groups;
  for (int r = 0; r < size; ++r) groups.push_back(std::make_shared<ThreadGroup>(shared, r, size, options));
  return groups;
}

}  // namespace tapegrad::dist::detail
