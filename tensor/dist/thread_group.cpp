// The in-process transport: the ranks are threads of one process sharing a Rendezvous. A collective is two meetings:
// at the first each rank posts its buffers, then every rank computes its own result from all of them (sums in rank
// order, so every rank gets the same bits); at the second they agree that everyone is done reading. A meeting that
// a rank misses for the timeout fails the group, naming the ranks that never came; so does a rank whose own part of
// a collective failed (abort), at once, naming its error.
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
#include <string>

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
  // Set when a rank gave up waiting or failed on its own: every meeting after `last_meeting` fails at once (those
  // before it every rank came to).
  bool broken = false;
  std::int64_t last_meeting = 0;
  std::string failed_rank;  // "rank r failed: <its error>" when a rank failed on its own
};

// memcpy, also of 0 bytes from or to a null pointer (an empty tensor's, an empty staging buffer's).
void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

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
      copy_bytes(sum.data(), posts[0].in, sum.size());
      for (std::size_t r = 1; r < posts.size(); ++r) add_into(dtype, sum.data(), posts[r].in, count);
    });
    copy_bytes(out, sum.data(), sum.size());
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    const std::size_t bytes = count * dtype_size(dtype);
    exchange("all_gather", {.in = in}, [&](const std::vector<Rendezvous::Post>& posts) {
      for (std::size_t r = 0; r < posts.size(); ++r) {
        copy_bytes(static_cast<unsigned char*>(out) + r * bytes, posts[r].in, bytes);
      }
    });
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype) override {
    const std::size_t offset = static_cast<std::size_t>(rank()) * count * dtype_size(dtype);
    exchange("reduce_scatter", {.in = in}, [&](const std::vector<Rendezvous::Post>& posts) {
      copy_bytes(out, static_cast<const unsigned char*>(posts[0].in) + offset, count * dtype_size(dtype));
      for (std::size_t r = 1; r < posts.size(); ++r) {
        add_into(dtype, out, static_cast<const unsigned char*>(posts[r].in) + offset, count);
      }
    });
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    exchange("broadcast", {.in = data}, [&](const std::vector<Rendezvous::Post>& posts) {
      if (rank() != root) copy_bytes(data, posts[static_cast<std::size_t>(root)].in, count * dtype_size(dtype));
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
      std::vector<int> devices(static_cast<std::size_t>(size()));  // (reading the posts must not throw)
      exchange("compare the ranks' GPUs", {.in = &device}, [&](const std::vector<Rendezvous::Post>& posts) {
        for (std::size_t r = 0; r < posts.size(); ++r) devices[r] = *static_cast<const int*>(posts[r].in);
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

  // The other ranks' current or next meeting fails at once, naming this rank's error.
  void abort(const std::string& what) override {
    Rendezvous& s = *shared_;
    {
      const std::lock_guard lock(s.mutex);
      if (!s.broken) {
        s.broken = true;
        s.last_meeting = s.arrived[static_cast<std::size_t>(rank())];
        s.failed_rank = "rank " + std::to_string(rank()) + " failed: " + what;
      }
    }
    s.changed.notify_all();
    Group::abort(what);
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
    const auto failed = [&] { return s.broken && meeting > s.last_meeting; };
    s.changed.notify_all();
    if (s.changed.wait_for(lock, options().timeout, [&] { return failed() || everyone_came(); }) && !failed()) {
      return;
    }
    if (!s.broken) {  // this rank gave up waiting
      s.broken = true;
      s.last_meeting = meeting - 1;
      s.changed.notify_all();
    }
    std::ostringstream missing;
    for (std::size_t r = 0; r < s.arrived.size(); ++r) {
      if (s.arrived[r] < meeting) missing << (missing.tellp() > 0 ? ", " : "") << r;
    }
    const std::string cause = !s.failed_rank.empty() ? s.failed_rank
                              : missing.tellp() > 0  ? "rank(s) " + missing.str() + " did not come within the timeout"
                                                     : "another rank gave up waiting";
    lock.unlock();
    fail(what + ": " + cause);
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
