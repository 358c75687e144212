#include "tapegrad/tensor/detail/small_blocks.hpp"

#include <array>
#include <cstdlib>

namespace tapegrad::detail {

namespace {

constexpr std::size_t granule = 64;
constexpr std::size_t classes = small_block_max / granule;
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t per_thread_limit = 0;  // every block back to the system: AddressSanitizer sees each use after free
#else
constexpr std::size_t per_thread_limit = std::size_t{4} << 20;
#endif

std::size_t class_of(std::size_t bytes) { return (bytes - 1) / granule; }
std::size_t class_bytes(std::size_t c) { return (c + 1) * granule; }

struct FreeBlock {
  FreeBlock* next;
};

// This thread's cache: plain data, so that reading it costs one load (no guard for a constructor; the initial-exec
// model skips the dynamic linker's lookup that thread-locals of a shared library otherwise cost on every access).
struct ThreadCache {
  std::array<FreeBlock*, classes> heads;
  std::size_t held;
  enum class State : unsigned char { unused, active, gone } state;
};
[[gnu::tls_model("initial-exec")]] thread_local ThreadCache cache{};

// Gives the cache's blocks back when the thread exits; blocks freed after that (by other thread-local objects
// holding tensors) go straight back to the system.
struct CacheRelease {
  ~CacheRelease() {
    for (FreeBlock* head : cache.heads) {
      while (head != nullptr) {
        FreeBlock* next = head->next;
        std::free(head);
        head = next;
      }
    }
    cache.state = ThreadCache::State::gone;
  }
};

// The cache, or null once the thread is exiting.
ThreadCache* thread_cache() {
  if (cache.state == ThreadCache::State::active) [[likely]] return &cache;
  if (cache.state == ThreadCache::State::gone) return nullptr;
  thread_local CacheRelease release;  // made on the first use, destroyed at the thread's exit
  (void)release;
  cache.state = ThreadCache::State::active;
  return &cache;
}

}  // namespace

void* small_block_allocate(std::size_t bytes) noexcept {
  const std::size_t c = class_of(bytes);
  if (ThreadCache* tc = thread_cache()) {
    if (FreeBlock* block = tc->heads[c]) {
      tc->heads[c] = block->next;
      tc->held -= class_bytes(c);
      return block;
    }
  }
  return std::aligned_alloc(granule, class_bytes(c));
}

void small_block_free(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  const std::size_t c = class_of(bytes);
  if (ThreadCache* tc = thread_cache(); tc != nullptr && tc->held + class_bytes(c) <= per_thread_limit) {
    tc->heads[c] = new (block) FreeBlock{tc->heads[c]};
    tc->held += class_bytes(c);
    return;
  }
  std::free(block);
}

void* block_allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > small_block_max) return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{granule});
  void* block = small_block_allocate(bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

void block_free(void* block, std::size_t bytes) noexcept {
  if (bytes == 0 || bytes > small_block_max) {
    ::operator delete(block, std::align_val_t{granule});
  } else {
    small_block_free(block, bytes);
  }
}

}  // namespace tapegrad::detail
