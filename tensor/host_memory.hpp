// Host memory for tensors: aligned blocks, with freed large blocks kept for reuse.
//
// Why a cache: the first touch of a fresh page is a page fault, and a new tensor is fresh memory (glibc maps
// large blocks anew and unmaps them on free). On virtual machines a fault costs 10-25 µs per 4 KiB page, so a
// 2 MiB intermediate costs milliseconds before a single flop; a reused block is already mapped. Blocks of
// `min_cached_bytes` and more are rounded up to a size class (2^k · {1, 1.25, 1.5, 1.75}: at most 25% slack) and on
// release go to their class's free list while the cache holds at most `cache_limit` bytes. Blocks up to 1 KiB come
// from the thread's small-block cache (tensor/detail/small_blocks.hpp). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tapegrad {

struct HostMemoryStats {
  std::int64_t in_use_bytes = 0;       // requested by live tensors
  std::int64_t peak_in_use_bytes = 0;  // the most in_use_bytes has been since the last reset_peak
  std::int64_t cached_bytes = 0;       // held in the cache's free lists
};

HostMemoryStats host_memory_stats();
void reset_host_memory_peak();
// The cache's capacity (default 1 GiB); lowering it releases what no longer fits. 0 turns caching off.
void set_host_cache_limit(std::size_t bytes);
// Returns every cached block to the system.
void release_host_cache();

namespace detail {
// A block of at least `bytes`, 64-byte aligned (2 MiB aligned and huge-page advised from 4 MiB); null for 0.
// Throws OutOfMemoryError (device cpu, naming the op in scope) when the system cannot supply it even after the cache
// is given back, and leaves the statistics as they were.
void* host_allocate(std::size_t bytes);
// Gives back a block from host_allocate of the same `bytes`.
void host_free(void* block, std::size_t bytes) noexcept;
}  // namespace detail

}  // namespace tapegrad
