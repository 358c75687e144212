#include "tensor/host_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

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

void* fresh_block(std::size_t size) {
  const std::size_t align = size >= huge_threshold ? huge_page : alignment;
  const std::size_t rounded = (size + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (align == huge_page) madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return p;
}

class HostCache {
 public:
  void* allocate(std::size_t bytes) {
    const std::size_t size = block_size(bytes);
    {
      std::lock_guard lock(mutex_);
      count_in_use(static_cast<std::int64_t>(bytes));
      if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= static_cast<std::int64_t>(size);
        return p;
      }
    }
    try {
      return fresh_block(size);
    } catch (...) {
      std::lock_guard lock(mutex_);
      count_in_use(-static_cast<std::int64_t>(bytes));
      throw;
    }
  }

  void free(void* p, std::size_t bytes) noexcept {
    const std::size_t size = block_size(bytes);
    std::lock_guard lock(mutex_);
    count_in_use(-static_cast<std::int64_t>(bytes));
    if (size >= min_cached_bytes && static_cast<std::size_t>(stats_.cached_bytes) + size <= limit_) {
      try {
        free_[size].push_back(p);
        stats_.cached_bytes += static_cast<std::int64_t>(size);
        return;
      } catch (...) {  // no memory for the list's bookkeeping: give the block back instead
      }
    }
    std::free(p);
  }

  HostMemoryStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }
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
  void count_in_use(std::int64_t delta) {
    stats_.in_use_bytes += delta;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  // Frees cached blocks, largest first, until the cache holds at most `keep` bytes.
  void trim(std::size_t keep) {
    std::vector<std::size_t> sizes;
    for (const auto& [size, blocks] : free_) sizes.push_back(size);
    std::sort(sizes.rbegin(), sizes.rend());
    for (std::size_t size : sizes) {
      auto& blocks = free_[size];
      while (!blocks.empty() && static_cast<std::size_t>(stats_.cached_bytes) > keep) {
        std::free(blocks.back());
        blocks.pop_back();
        stats_.cached_bytes -= static_cast<std::int64_t>(size);
      }
    }
  }

  std::mutex mutex_;
  std::size_t limit_ = std::size_t{1} << 30;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  HostMemoryStats stats_;
};

// Never destroyed: tensors in static objects may be released after main returns.
HostCache& cache() {
  static HostCache* instance = new HostCache();
  return *instance;
}

}  // namespace

HostMemoryStats host_memory_stats() { return cache().stats(); }
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
