// The MPI transport: a duplicate of MPI_COMM_WORLD (or a split of one) with MPI_ERRORS_RETURN, every collective a
// nonblocking one polled under the communicator's timeout. Sums of the 16-bit and fp8 types are user-defined MPI ops
// that round after each addition. Open MPI 4 reports no dead peer to the survivors (mpirun ends them instead), and a
// hung one only through this timeout: the timed-out ranks then spend a grace second finding out which ranks still
// answer, so that the error names the ranks that did not.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <thread>

#include "tapegrad/tensor/dist/detail/fingerprint.hpp"
#include "tapegrad/tensor/dist/detail/group.hpp"
#include "tapegrad/tensor/dist/detail/nccl_link.hpp"
#include "tapegrad/tensor/dtype.hpp"

namespace tapegrad::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, length);
}

[[noreturn]] void throw_mpi_error(int code, const char* call) {
  throw CommunicationError(std::string("MPI error: ") + call + " failed: " + error_text(code));
}
#define TAPEGRAD_MPI_CHECK(call)                                      \
  do {                                                                \
    if (const int tapegrad_code_ = (call); tapegrad_code_ != MPI_SUCCESS) \
      throw_mpi_error(tapegrad_code_, #call);                         \
  } while (0)

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::f8e4m3:
    case DType::f8e5m2: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

// inout[i] = in[i] + inout[i], added in f32 and rounded to T.
template <class T> void rounded_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = convert<T>(convert<float>(a[i]) + convert<float>(b[i]));
}

template <class T> MPI_Op make_sum() {
  MPI_Op op = MPI_OP_NULL;
  TAPEGRAD_MPI_CHECK(MPI_Op_create(&rounded_sum<T>, 1, &op));
  return op;
}

MPI_Op sum_op(DType dtype) {
  switch (dtype) {
    case DType::bf16: { static const MPI_Op op = make_sum<bf16>(); return op; }
    case DType::f16: { static const MPI_Op op = make_sum<f16>(); return op; }
    case DType::f8e4m3: { static const MPI_Op op = make_sum<f8e4m3>(); return op; }
    case DType::f8e5m2: { static const MPI_Op op = make_sum<f8e5m2>(); return op; }
    default: return MPI_SUM;
  }
}

int mpi_count(std::size_t count, const char* op) {
  check(count <= static_cast<std::size_t>(INT_MAX), op, count,
        " elements per rank are more than one MPI call takes (2^31 - 1)");
  return static_cast<int>(count);
}

// Whether `request` completed within `limit`. Spins first, then yields, then sleeps: ranks may share cores.
bool poll(MPI_Request& request, std::chrono::milliseconds limit) {
  const auto start = Clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    if (const int code = MPI_Test(&request, &done, MPI_STATUS_IGNORE); code != MPI_SUCCESS) {
      note_group_failed();
      throw_mpi_error(code, "MPI_Test");
    }
    if (done) return true;
    const auto waited = Clock::now() - start;
    if (waited > limit) return false;
    if (polls < 64) continue;
    if (waited < std::chrono::milliseconds(10)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream out;
  out << static_cast<double>(d.count()) / 1000.0 << " s";
  return out.str();
}

class MpiGroup final : public Group {
 public:
  MpiGroup(MPI_Comm comm, int rank, int size, const CommunicatorOptions& options)
      : Group(rank, size, options), comm_(comm) {}
  ~MpiGroup() override {
    links_.clear();  // (NCCL first: it was bootstrapped over this communicator)
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  std::vector<Fingerprint> disagreement(const Fingerprint& mine) override {
    // The maximum of every field and of its negation (the minimum) in one all-reduce: all equal when max == min.
    std::array<std::int64_t, 2 * std::tuple_size_v<Fingerprint>> both{};
    const std::size_t n = mine.size();
    for (std::size_t i = 0; i < n; ++i) {
      both[i] = mine[i];
      both[n + i] = -mine[i];
    }
    const std::string what = describe(call_of(mine));  // a rank that never comes is reported here
    run(what.c_str(), [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, both.data(), static_cast<int>(both.size()), MPI_INT64_T, MPI_MAX, comm_, r);
    });
    bool equal = true;
    for (std::size_t i = 0; i < n; ++i) equal = equal && both[i] == -both[n + i];
    if (equal) return {};
    std::vector<Fingerprint> all(static_cast<std::size_t>(size()));
    run(what.c_str(), [&](MPI_Request* r) {
      return MPI_Iallgather(mine.data(), static_cast<int>(n), MPI_INT64_T, all.data(), static_cast<int>(n),
                            MPI_INT64_T, comm_, r);
    });
    return all;
  }

  void all_reduce(const void* in, void* out, std::size_t count, DType dtype) override {
    const int n = mpi_count(count, "all_reduce");
    run("all_reduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, n, mpi_type(dtype), sum_op(dtype), comm_, r);
    });
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype) override {
    const int n = mpi_count(count, "all_gather");
    run("all_gather", [&](MPI_Request* r) {
      return MPI_Iallgather(in, n, mpi_type(dtype), out, n, mpi_type(dtype), comm_, r);
    });
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype) override {
    const int n = mpi_count(count, "reduce_scatter");
    run("reduce_scatter", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, out, n, mpi_type(dtype), sum_op(dtype), comm_, r);
    });
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root) override {
    const int n = mpi_count(count, "broadcast");
    run("broadcast", [&](MPI_Request* r) { return MPI_Ibcast(data, n, mpi_type(dtype), root, comm_, r); });
  }
  void barrier() override {
    run("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  std::unique_ptr<Request> start_all_reduce(void* data, std::size_t count, DType dtype) override {
    throw_if_failed();
    auto request = std::make_unique<MpiRequest>(*this);
    const int code = MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count, "all_reduce"), mpi_type(dtype),
                                    sum_op(dtype), comm_, &request->request);
    if (code != MPI_SUCCESS) fail(std::string("all_reduce: ") + error_text(code));
    return request;
  }

  std::shared_ptr<Group> split(int color, int key, const std::string& name) override {
    throw_if_failed();
    check(color >= 0, "split", "color ", color, " must be 0 or more");
    Call call;
    call.op = Collective::split;
    call.number = next_call();
    agree(*this, call);  // every rank is here: the blocking split below cannot hang
    MPI_Comm comm = MPI_COMM_NULL;
    TAPEGRAD_MPI_CHECK(MPI_Comm_split(comm_, color, key, &comm));
    return make(comm, {options().timeout, name});
  }

  DeviceLink& device_link(int device) override {
    throw_if_failed();
    auto& link = links_[device];
    if (!link) {
      link = make_nccl_link(*this, device, [&](void* id, std::size_t bytes) {
        run("share NCCL's id", [&](MPI_Request* r) {
          return MPI_Ibcast(id, static_cast<int>(bytes), MPI_BYTE, 0, comm_, r);
        });
      });
    }
    return *link;
  }

  // A group for `comm`, with errors returned rather than fatal.
  static std::shared_ptr<Group> make(MPI_Comm comm, const CommunicatorOptions& options) {
    TAPEGRAD_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    int rank = 0, size = 0;
    TAPEGRAD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    TAPEGRAD_MPI_CHECK(MPI_Comm_size(comm, &size));
    return std::make_shared<MpiGroup>(comm, rank, size, options);
  }

 private:
  // Starts a nonblocking call (start(&request)) and polls it to completion; after the timeout fails the group,
  // naming `what` and the ranks that did not answer.
  template <class Start> void run(const char* what, Start&& start) {
    throw_if_failed();
    MPI_Request request = MPI_REQUEST_NULL;
    const int started = start(&request);
    if (started != MPI_SUCCESS) fail(std::string(what) + ": " + error_text(started));
    if (!poll(request, options().timeout)) {
      fail(std::string(what) + ": not every rank took part within " + seconds(options().timeout) + " (" +
           roll_call() + ")");
    }
  }

  // After a timeout: each rank that also timed out sends the others a message (point to point, which MPI keeps
  // apart from collectives) and listens for a second; ranks stuck elsewhere (or gone) stay silent.
  std::string roll_call() {
    constexpr int tag = 0x7467;
    const std::int64_t mine = rank();
    std::vector<std::int64_t> theirs(static_cast<std::size_t>(size()), -1);
    std::vector<MPI_Request> sends, receives(static_cast<std::size_t>(size()), MPI_REQUEST_NULL);
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      MPI_Request s = MPI_REQUEST_NULL;
      MPI_Isend(&mine, 1, MPI_INT64_T, r, tag, comm_, &s);
      sends.push_back(s);
      MPI_Irecv(&theirs[static_cast<std::size_t>(r)], 1, MPI_INT64_T, r, tag, comm_,
                &receives[static_cast<std::size_t>(r)]);
    }
    std::vector<int> silent;
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      auto& request = receives[static_cast<std::size_t>(r)];
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (!poll(request, std::max(left, std::chrono::milliseconds(0)))) silent.push_back(r);
    }
    // The requests that did not complete are left in flight: the job cannot go on, and a Session aborts it.
    std::ostringstream out;
    if (silent.empty()) {
      out << "every rank answered afterwards: they were slower than the timeout";
    } else {
      out << (silent.size() == 1 ? "rank " : "ranks ");
      for (std::size_t i = 0; i < silent.size(); ++i) out << (i ? ", " : "") << silent[i];
      out << " did not answer: hung, gone, or in another collective";
    }
    return out.str();
  }

  // A nonblocking all_reduce of start_all_reduce, completed under the group's timeout.
  struct MpiRequest final : Request {
    explicit MpiRequest(MpiGroup& group) : group(group) {}
    void wait() override {
      if (request == MPI_REQUEST_NULL) return;
      group.throw_if_failed();
      if (!poll(request, group.options().timeout)) {
        group.fail("all_reduce (started earlier): not every rank took part within " +
                   seconds(group.options().timeout) + " (" + group.roll_call() + ")");
      }
    }
    void progress() override {
      int done = 0;
      if (request != MPI_REQUEST_NULL) MPI_Test(&request, &done, MPI_STATUS_IGNORE);  // (errors surface in wait)
    }
    MpiGroup& group;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  MPI_Comm comm_;
  std::map<int, std::unique_ptr<DeviceLink>> links_;
};

}  // namespace

std::shared_ptr<Group> world_group(const CommunicatorOptions& options) {
  int initialized = 0, finalized = 0;
  TAPEGRAD_MPI_CHECK(MPI_Initialized(&initialized));
  TAPEGRAD_MPI_CHECK(MPI_Finalized(&finalized));
  check(initialized && !finalized, "dist::Communicator::world",
        "MPI is not running: make a dist::Session (it initializes MPI) before the first communicator");
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  TAPEGRAD_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request));
  if (!poll(request, options.timeout)) {
    note_group_failed();
    throw CommunicationError("dist::Communicator::world: not every rank of the job made its communicator within " +
                             seconds(options.timeout));
  }
  return MpiGroup::make(comm, options);
}

}  // namespace tapegrad::dist::detail
