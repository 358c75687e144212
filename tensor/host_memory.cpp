#include "tapegrad/tensor/host_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/core/detail/op_scope.hpp"  // for current_op, and it declares throw_host_out_of_memory
#include "tapegrad/tensor/detail/small_blocks.hpp"

namespace tapegrad {

namespace {

constexpr std::size_t alignment = 64;  // a cache line, and enough for any SIMD packet Eigen uses
// Large buffers are 2 MiB aligned and asked to be backed by transparent huge pages: a fault then maps 2 MiB.
constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t huge_threshold = 2 * huge_page;
// Below this, glibc's heap reuses memory well by itself.
constexpr std::size_t min_cached_bytes = std::size_t{64} << 10;

// The size a request is served with: cached sizes rounded up to their class, others to the alignment.
std::size_t block_size(std::size_t bytes) {
  if (bytes < min_cached_bytes) return (bytes + alignment - 1) / alignment * alignment;
  const std::size_t quarter = std::bit_floor(bytes) / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

// A fresh block from the system, or null when it has none.
void* fresh_block(std::size_t size) {
  const std::size_t align = size >= huge_threshold ? huge_page : alignment;
  const std::size_t rounded = (size + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p != nullptr && align == huge_page) madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return p;
}

// Linux hands out address space it may never back (overcommit): a block larger than the memory left is granted,
// and touching it later kills the process. Blocks from this size on are first compared with what is left, which
// costs a read of /proc/meminfo: nothing beside the page faults that filling them costs.
constexpr std::size_t checked_size = std::size_t{64} << 20;

struct SystemMemory {
  std::size_t available = SIZE_MAX, total = SIZE_MAX;  // unknown: unlimited
};

// "<key>: <n> kB" from /proc/meminfo, in bytes; 0 when absent.
std::size_t meminfo_bytes(const std::string& text, std::string_view key) {
  const std::size_t at = text.find(key);
  return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + key.size(), nullptr, 10) * 1024;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The memory limit and use of this process's memory cgroup (v2, or v1's memory controller), in bytes; false when
// it has no limit. /proc/self/cgroup lines read "id:controllers:path", v2's with no controllers.
bool cgroup_memory(std::size_t& limit, std::size_t& used) {
  std::istringstream lines(read_file("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const std::size_t first = line.find(':'), second = line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    const bool v2 = controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    const std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + path;
    const std::string max = read_file(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    if (max.empty() || max.starts_with("max")) continue;
    limit = std::strtoull(max.c_str(), nullptr, 10);
    used = std::strtoull(read_file(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")).c_str(), nullptr, 10);
    if (limit < (std::size_t{1} << 62)) return true;  // v1 writes "no limit" as 2^63 - 1 rounded to pages
  }
  return false;
}

// What the system can still give this process: available memory and free swap, within its cgroup's limit.
SystemMemory system_memory() {
  const std::string info = read_file("/proc/meminfo");
  if (info.empty()) return {};
  SystemMemory m{.available = meminfo_bytes(info, "MemAvailable:") + meminfo_bytes(info, "SwapFree:"),
                 .total = meminfo_bytes(info, "MemTotal:") + meminfo_bytes(info, "SwapTotal:")};
  if (std::size_t limit = 0, used = 0; cgroup_memory(limit, used)) {
    m.total = std::min(m.total, limit);
    m.available = std::min(m.available, limit > used ? limit - used : 0);
  }
  return m;
}

class HostCache {
 public:
  void* allocate(std::size_t bytes) {
    const std::size_t size = block_size(bytes);
    if (size <= detail::small_block_max) {  // the thread's own cache: no lock (tensor/detail/small_blocks.hpp)
      void* p = detail::small_block_allocate(size);
      if (p == nullptr) p = system_block(size, bytes);
      count_in_use(static_cast<std::int64_t>(bytes));
      return p;
    }
    if (size >= min_cached_bytes) {  // (smaller blocks are never cached: no lock to look)
      std::lock_guard lock(mutex_);
      if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= static_cast<std::int64_t>(size);
        count_in_use(static_cast<std::int64_t>(bytes));
        return p;
      }
    }
    void* p = system_block(size, bytes);
    count_in_use(static_cast<std::int64_t>(bytes));
    return p;
  }

  void free(void* p, std::size_t bytes) noexcept {
    const std::size_t size = block_size(bytes);
    count_in_use(-static_cast<std::int64_t>(bytes));
    if (size <= detail::small_block_max) {
      detail::small_block_free(p, size);
      return;
    }
    std::lock_guard lock(mutex_);
    if (size >= min_cached_bytes && static_cast<std::size_t>(cached_bytes_) + size <= limit_) {
      try {
        free_[size].push_back(p);
        cached_bytes_ += static_cast<std::int64_t>(size);
        return;
      } catch (...) {  // no memory for the list's bookkeeping: give the block back instead
      }
    }
    std::free(p);
  }

  HostMemoryStats stats() {
    std::lock_guard lock(mutex_);
    return {.in_use_bytes = in_use_.load(), .peak_in_use_bytes = peak_.load(), .cached_bytes = cached_bytes_};
  }
  void reset_peak() { peak_.store(in_use_.load()); }
  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    trim(limit_);
  }
  void release() {
    std::lock_guard lock(mutex_);
    trim(0);
  }

 private:
  // Atomic, not under the lock: small blocks are counted on every tensor a recorded node makes.
  void count_in_use(std::int64_t delta) {
    const std::int64_t now = in_use_.fetch_add(delta, std::memory_order_relaxed) + delta;
    for (std::int64_t peak = peak_.load(std::memory_order_relaxed);
         now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed);) {
    }
  }
  // A block of `size` from the system for a request of `bytes`. When the system has too little left, the cache goes
  // back to it first if that would make room; otherwise (or still failing) OutOfMemoryError, with nothing changed.
  void* system_block(std::size_t size, std::size_t bytes) {
    for (bool trimmed = false;; trimmed = true) {
      const SystemMemory memory = size >= checked_size ? system_memory() : SystemMemory{};
      if (size <= memory.available) {
        if (void* p = fresh_block(size)) return p;
      }
      const SystemMemory left = size >= checked_size ? memory : system_memory();
      std::lock_guard lock(mutex_);
      const auto cached = static_cast<std::size_t>(cached_bytes_);
      if (trimmed || cached == 0 || size > left.available + cached) {
        throw OutOfMemoryError(current_op("allocate"), Device::cpu(), bytes, left.available, left.total);
      }
      trim(0);
    }
  }
  // Frees cached blocks, largest first, until the cache holds at most `keep` bytes.
  void trim(std::size_t keep) {
    std::vector<std::size_t> sizes;
    for (const auto& [size, blocks] : free_) sizes.push_back(size);
    std::sort(sizes.rbegin(), sizes.rend());
    for (std::size_t size : sizes) {
      auto& blocks = free_[size];
      while (!blocks.empty() && static_cast<std::size_t>(cached_bytes_) > keep) {
        std::free(blocks.back());
        blocks.pop_back();
        cached_bytes_ -= static_cast<std::int64_t>(size);
      }
    }
  }

  std::mutex mutex_;
  std::size_t limit_ = std::size_t{1} << 30;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::int64_t cached_bytes_ = 0;  // under the lock
  std::atomic<std::int64_t> in_use_{0}, peak_{0};
};

// Never destroyed: tensors in static objects may be released after main returns.
HostCache& cache() {
  static HostCache* instance = new HostCache();
  return *instance;
}

}  // namespace

HostMemoryStats host_memory_stats() { return cache().stats(); }

namespace detail {
void throw_host_out_of_memory(std::string_view op) {
  const SystemMemory memory = system_memory();
  throw OutOfMemoryError(op, Device::cpu(), 0, memory.available, memory.total);
}
}  // namespace detail
void reset_host_memory_peak() { cache().reset_peak(); }
void set_host_cache_limit(std::size_t bytes) { cache().set_limit(bytes); }
void release_host_cache() { cache().release(); }

namespace detail {
void* host_allocate(std::size_t bytes) { return bytes == 0 ? nullptr : cache().allocate(bytes); }
void host_free(void* block, std::size_t bytes) noexcept {
  if (block != nullptr) cache().free(block, bytes);
}
}  // namespace detail

}  // namespace tapegrad
