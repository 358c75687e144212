#include "tapegrad/tensor/eigen.hpp"

#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>

namespace tapegrad {

namespace {
struct Pool {
  std::unique_ptr<Eigen::ThreadPool> pool;
  std::unique_ptr<Eigen::ThreadPoolDevice> device;
  void reset(int threads) {
    device.reset();
    pool = std::make_unique<Eigen::ThreadPool>(threads);
    device = std::make_unique<Eigen::ThreadPoolDevice>(pool.get(), threads);
  }
};
Pool& pool_state() {
  static Pool state = [] {
    Pool p;
    p.reset(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    return p;
  }();
  return state;
}
}  // namespace

Eigen::ThreadPoolDevice& cpu_pool() { return *pool_state().device; }
int num_threads() { return pool_state().device->numThreads(); }
void set_num_threads(int threads) {
  check(threads >= 1, "set_num_threads", "thread count must be at least 1, got ", threads);
  pool_state().reset(threads);
}

void parallel_for(std::int64_t n, std::int64_t cost_per_item,
                  const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  std::int64_t work = 0;  // an overflowing product is plenty of work
  const bool large = __builtin_mul_overflow(n, std::max<std::int64_t>(cost_per_item, 1), &work) ||
                     work >= parallel_threshold;
  if (!large || num_threads() == 1) {
    body(0, n);
    return;
  }
  const Eigen::TensorOpCost cost(0, 0, static_cast<double>(cost_per_item));
  cpu_pool().parallelFor(n, cost, [&](Eigen::Index begin, Eigen::Index end) { body(begin, end); });
}

}  // namespace tapegrad
