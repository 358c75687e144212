// The host allocator: alignment, accounting of bytes in use, reuse of cached blocks, and the cache's limit.
#include <doctest/doctest.h>

#include <cstdint>

#include "tapegrad.hpp"
#include "tensor/host_memory.hpp"

using namespace tapegrad;

TEST_CASE("tensor memory is aligned, counted while in use, and given back") {
  release_host_cache();
  const HostMemoryStats before = host_memory_stats();
  {
    const Tensor<float> small(Shape{3, 5}), large(Shape{1 << 21});  // 60 bytes; 8 MiB (huge-page aligned)
    CHECK(reinterpret_cast<std::uintptr_t>(small.data()) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(large.data()) % (std::uintptr_t{2} << 20) == 0);
    CHECK(host_memory_stats().in_use_bytes - before.in_use_bytes == 60 + (std::int64_t{8} << 20));
    CHECK(host_memory_stats().peak_in_use_bytes >= before.in_use_bytes + (std::int64_t{8} << 20));
  }
  CHECK(host_memory_stats().in_use_bytes == before.in_use_bytes);
}

TEST_CASE("a freed large block is reused by the next tensor of its size class") {
  release_host_cache();
  const void* first = nullptr;
  {
    Tensor<double> a(Shape{100000});  // 800 kB: cached on release
    first = a.data();
    a.flat(0) = 1.0;
  }
  CHECK(host_memory_stats().cached_bytes >= 800000);
  const Tensor<double> b(Shape{99000});  // a little smaller, same size class
  CHECK(b.data() == first);
  CHECK(host_memory_stats().cached_bytes == 0);
}

TEST_CASE("the cache keeps at most its limit, and releasing it frees every block") {
  release_host_cache();
  set_host_cache_limit(std::size_t{1} << 20);
  { const Tensor<float> a(Shape{200000}), b(Shape{200000}); }  // 800 kB each: only one fits in 1 MiB
  CHECK(host_memory_stats().cached_bytes > 0);
  CHECK(host_memory_stats().cached_bytes <= (std::int64_t{1} << 20));
  release_host_cache();
  CHECK(host_memory_stats().cached_bytes == 0);
  set_host_cache_limit(0);
  { const Tensor<float> c(Shape{200000}); }
  CHECK(host_memory_stats().cached_bytes == 0);
  set_host_cache_limit(std::size_t{1} << 30);
}
