// Small blocks (up to 1 KiB) from a per-thread cache, for what recording a node allocates and frees by the
// thousand per backward pass: the node, its variable, a tensor's storage record and a small tensor's data.
//
// Why: glibc's per-thread cache keeps 7 freed blocks of a size; a chain of 1000 nodes frees thousands, and the rest
// went through glibc's locked bins (half of a recorded node's time). Here each thread keeps up to 4 MiB of freed
// blocks by size class (multiples of 64 bytes, 64-byte aligned) and serves them without a lock. A block may be freed
// on any thread: it joins that thread's cache, or goes back to the system once the cache is full. A thread's cache
// goes back to the system when the thread exits.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace tapegrad::detail {

inline constexpr std::size_t small_block_max = 1024;

// A block of `bytes` (64-byte aligned; up to small_block_max from the cache, else from operator new); throws
// std::bad_alloc.
void* block_allocate(std::size_t bytes);
// Gives back a block from block_allocate of the same `bytes`.
void block_free(void* block, std::size_t bytes) noexcept;
// A block of `bytes` in 1..small_block_max, or null when the system has none.
void* small_block_allocate(std::size_t bytes) noexcept;
void small_block_free(void* block, std::size_t bytes) noexcept;

// A standard allocator over block_allocate: for allocate_shared and containers that live on the recording path.
template <class T> struct BlockAllocator {
  using value_type = T;
  static_assert(alignof(T) <= 64, "BlockAllocator: blocks are 64-byte aligned");
  BlockAllocator() = default;
  template <class U> BlockAllocator(const BlockAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(block_allocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { block_free(p, n * sizeof(T)); }
  template <class U> bool operator==(const BlockAllocator<U>&) const noexcept { return true; }
};

}  // namespace tapegrad::detail
