// The host allocator: alignment, accounting of bytes in use, reuse of cached blocks, and the cache's limit.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/host_memory.hpp"

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

TEST_CASE("small tensors made on one thread and freed on another are counted and given back") {
  // Blocks up to 1 KiB come from a per-thread cache; one freed on another thread joins that thread's cache.
  const HostMemoryStats before = host_memory_stats();
  std::vector<Tensor<float>> made;
  std::thread maker([&] {
    for (int i = 0; i < 1000; ++i) made.emplace_back(Shape{1 + i % 200});
  });
  maker.join();
  std::int64_t bytes = 0;
  for (const Tensor<float>& t : made) bytes += t.numel() * 4;
  CHECK(host_memory_stats().in_use_bytes - before.in_use_bytes == bytes);
  std::thread freer([&] { made.clear(); });
  freer.join();
  CHECK(host_memory_stats().in_use_bytes == before.in_use_bytes);
  const Tensor<float> again(Shape{7});  // this thread's cache still serves
  CHECK(reinterpret_cast<std::uintptr_t>(again.data()) % 64 == 0);
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

namespace {
// Runs `allocate`, which must fail for want of host memory, and checks the error and that it changed nothing.
template <class F> void check_out_of_host_memory(F allocate, const std::string& op, bool one_allocation) {
  const HostMemoryStats before = host_memory_stats();
  try {
    allocate();
    FAIL("no error");
  } catch (const OutOfMemoryError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).starts_with(op + ": out of memory on cpu: asked for "));
    CHECK(e.device() == Device::cpu());
    CHECK(e.bytes_requested() > e.bytes_free());
    CHECK(e.bytes_free() <= e.bytes_total());
  }
  const HostMemoryStats after = host_memory_stats();
  CHECK(after.in_use_bytes == before.in_use_bytes);
  if (one_allocation) {  // an op may have made smaller tensors before the one that failed
    CHECK(after.peak_in_use_bytes == before.peak_in_use_bytes);
    CHECK(after.cached_bytes == before.cached_bytes);
  }
  CHECK(sum(param(ones<float>({1000}))).value().item() == 1000.0f);  // and the next op works
}
}  // namespace

TEST_CASE("a host allocation the system cannot satisfy throws OutOfMemoryError on the cpu and changes nothing") {
  const std::int64_t tebi = std::int64_t{1} << 40;  // 4 TiB of f32
  check_out_of_host_memory([&] { Tensor<float> t({tebi}); }, "allocate", true);
  check_out_of_host_memory([&] { zeros<float>({tebi}); }, "zeros", true);
  const Var<float> column = param(ones<float>({std::int64_t{1} << 20, 1})), row = param(ones<float>({1, std::int64_t{1} << 20}));
  check_out_of_host_memory([&] { Var<float> y = column * row; }, "mul", true);  // broadcast to 2^40
  check_out_of_host_memory([&] { matmul(column, row); }, "matmul", true);
  // A layernorm_mlp whose z is [2^20, 2^20] (4 TiB) while x and the kernels take 4 MiB each.
  const Var<float> x = param(ones<float>({std::int64_t{1} << 20, 1})), gamma = param(ones<float>({1}));
  const MLPKernels<float> kernels{param(ones<float>({1, 1, std::int64_t{1} << 20})),
                                  param(ones<float>({std::int64_t{1} << 20, 1}))};
  check_out_of_host_memory([&] { layernorm_mlp(x, gamma, {}, kernels, {}); }, "layernorm_mlp", false);
}
