// The CUDA backend's foundation on a real GPU: transfers, copies on the device, the caching allocator's accounting
// and its out-of-memory path, user streams, and the guard rails that keep host code off device memory.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

#include "tapegrad/tensor/gpu/memory.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::bitwise_equal;

namespace {
const Device gpu = Device::cuda(0);
const Device host = Device::cpu();
}  // namespace

TEST_CASE_TEMPLATE("a round trip through the GPU gives back every bit", T, float, double, bf16, f16) {
  for (const std::int64_t n : {0, 1, 7, 1000003}) {
    CAPTURE(n);
    const Tensor<T> original = randn<T>({n}, 11 + static_cast<std::uint64_t>(n));
    const Tensor<T> on_gpu = original.to(gpu);
    CHECK(on_gpu.device() == gpu);
    CHECK(on_gpu.shape() == original.shape());
    const Tensor<T> back = on_gpu.to(host);
    CHECK(back.device() == host);
    CHECK(bitwise_equal(back, original));
  }
  // Values that arithmetic would disturb travel untouched, and the shape comes back with them.
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor<T> special = from_vector<T>({convert<T>(-0.0), convert<T>(inf), convert<T>(-inf),
                                            convert<T>(std::nan("")), std::numeric_limits<T>::denorm_min(),
                                            std::numeric_limits<T>::max()},
                                           {2, 3});
  const Tensor<T> back = special.to(gpu).to(host);
  CHECK(back.shape() == special.shape());
  CHECK(bitwise_equal(back, special));
}

TEST_CASE("to() the device a tensor is on returns the tensor itself") {
  const Tensor<float> on_gpu = randn<float>({5}, 1).to(gpu);
  CHECK(on_gpu.to(gpu).shares_storage_with(on_gpu));
  const Tensor<float> on_host = on_gpu.to(host);
  CHECK(on_host.to(host).shares_storage_with(on_host));
}

TEST_CASE("clone on the GPU copies on the device, independent of the original") {
  const Tensor<float> values = randn<float>({4099}, 3);
  Tensor<float> copy;
  {
    const Tensor<float> original = values.to(gpu);
    copy = original.clone();
    CHECK(copy.device() == gpu);
    CHECK_FALSE(copy.shares_storage_with(original));
  }
  // The original's memory is back in the pool, where the next allocation of its size is likely to find it.
  const Tensor<float> other_values = randn<float>({4099}, 4);
  const Tensor<float> other = other_values.to(gpu);
  CHECK(bitwise_equal(copy.to(host), values));
  CHECK(bitwise_equal(other.to(host), other_values));
}

TEST_CASE("memory in use grows by what tensors hold, returns when they die, and stays cached in the pool") {
  const cuda::MemoryStats before = cuda::memory_stats(0);
  cuda::MemoryStats during;
  {
    const Tensor<float> a({1000}, gpu);
    const Tensor<double> b({3, 333}, gpu);
    const Tensor<bf16> empty({0}, gpu);
    during = cuda::memory_stats(0);
    CHECK(during.in_use == before.in_use + 1000 * sizeof(float) + 999 * sizeof(double));
    CHECK(during.reserved >= during.in_use);
    CHECK(during.device_free <= during.device_total);
    CHECK(during.device_total > 0);
  }
  cuda::synchronize(0);
  const cuda::MemoryStats after = cuda::memory_stats(0);
  CHECK(after.in_use == before.in_use);
  CHECK(after.reserved == during.reserved);  // a synchronize does not hand cached memory back to the driver
}

TEST_CASE("the peak of memory in use covers what a step held at its most, and restarts from the memory in use") {
  const Tensor<float> kept({1024}, gpu);
  cuda::reset_peak_memory(0);
  const std::size_t start = cuda::memory_stats(0).in_use;
  CHECK(cuda::memory_stats(0).peak_in_use == start);
  {
    const Tensor<float> a({4096}, gpu);
    { const Tensor<double> b({2048}, gpu); }  // 16 KiB at once with a
  }
  const Tensor<float> c({1000}, gpu);  // less than the step's most
  const cuda::MemoryStats after = cuda::memory_stats(0);
  CHECK(after.peak_in_use == start + 4096 * sizeof(float) + 2048 * sizeof(double));
  CHECK(after.in_use == start + 1000 * sizeof(float));
  cuda::reset_peak_memory(0);
  CHECK(cuda::memory_stats(0).peak_in_use == after.in_use);
}

TEST_CASE("asking for more memory than the GPU has throws OutOfMemoryError, and the GPU stays usable") {
  // Some cached memory first: the failed allocation must hand it back to the driver before giving up.
  constexpr std::size_t cached_bytes = std::size_t{256} << 20;
  { const Tensor<float> scratch({static_cast<std::int64_t>(cached_bytes / sizeof(float))}, gpu); }
  cuda::synchronize(0);
  const cuda::MemoryStats before = cuda::memory_stats(0);
  REQUIRE(before.reserved >= before.in_use + cached_bytes);

  const std::int64_t numel = static_cast<std::int64_t>(2 * before.device_total / sizeof(float));
  const std::size_t asked = static_cast<std::size_t>(numel) * sizeof(float);
  CHECK_THROWS_AS(Tensor<float>({numel}, gpu), OutOfMemoryError);
  bool threw = false;
  try {
    const Tensor<float> huge({numel}, gpu);
  } catch (const OutOfMemoryError& e) {
    threw = true;
    CHECK(e.device() == gpu);
    CHECK(e.bytes_requested() == asked);
    CHECK(e.bytes_total() == before.device_total);
    CHECK(e.bytes_free() <= e.bytes_total());
    const std::string expected = "allocate: out of memory on cuda:0: asked for " + format_bytes(asked) + " (" +
                                 std::to_string(asked) + " bytes), " + format_bytes(e.bytes_free()) + " free of " +
                                 format_bytes(e.bytes_total());
    CHECK(std::string(e.what()) == expected);
  }
  CHECK(threw);

  const cuda::MemoryStats after = cuda::memory_stats(0);
  CHECK(after.in_use == before.in_use);
  CHECK(after.reserved + cached_bytes <= before.reserved);  // the cache went back to the driver
  // A normal allocation and a round trip work afterwards, and so does the tape.
  const Tensor<float> values = randn<float>({1 << 20}, 5);
  CHECK(bitwise_equal(values.to(gpu).to(host), values));
  const Var<double> x = param(randn<double>({3}, 6));
  backward(sum(x * x));
  for (std::int64_t i = 0; i < 3; ++i) CHECK(x.grad().flat(i) == 2 * x.value().flat(i));
}

TEST_CASE("a StreamGuard makes this thread's allocations and copies use the caller's stream") {
  CHECK(cuda::current_stream(0) == cuda::default_stream(0));
  unsigned flags = 0;
  REQUIRE(cudaStreamGetFlags(cuda::default_stream(0), &flags) == cudaSuccess);
  CHECK(flags == cudaStreamNonBlocking);  // tapegrad's stream does not wait for the legacy default stream

  cudaStream_t mine = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
  const Tensor<bf16> values = randn<bf16>({4097}, 8);
  {
    const cuda::StreamGuard guard(mine, 0);
    CHECK(cuda::current_stream(0) == mine);
    cuda::Stream elsewhere = nullptr;
    std::thread([&] { elsewhere = cuda::current_stream(0); }).join();
    CHECK(elsewhere == cuda::default_stream(0));  // the choice is this thread's

    const Tensor<bf16> on_gpu = values.to(gpu);  // allocated and copied on `mine`, and freed on it
    {
      const cuda::StreamGuard legacy(nullptr, 0);  // guards nest; null is CUDA's legacy default stream
      CHECK(cuda::current_stream(0) == nullptr);
      CHECK(bitwise_equal(on_gpu.clone().to(host), values));
    }
    CHECK(cuda::current_stream(0) == mine);
    CHECK(bitwise_equal(on_gpu.to(host), values));
  }
  CHECK(cuda::current_stream(0) == cuda::default_stream(0));
  REQUIRE(cudaStreamSynchronize(mine) == cudaSuccess);  // the frees queued on it have run
  REQUIRE(cudaStreamDestroy(mine) == cudaSuccess);
}

TEST_CASE("set_stream chooses this thread's stream until changed back") {
  cudaStream_t mine = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
  cuda::set_stream(mine, 0);
  CHECK(cuda::current_stream(0) == mine);
  {
    const Tensor<f16> values = randn<f16>({33}, 9);
    CHECK(bitwise_equal(values.to(gpu).to(host), values));
  }
  cuda::set_stream(cuda::default_stream(0), 0);
  CHECK(cuda::current_stream(0) == cuda::default_stream(0));
  REQUIRE(cudaStreamSynchronize(mine) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(mine) == cudaSuccess);
}

TEST_CASE("element access on a GPU tensor throws naming the access and the device") {
  Tensor<float> t = randn<float>({2, 3}, 1).to(gpu);
  const Tensor<float>& read_only = t;
  const std::string rest = ": the tensor is on cuda:0; copy it to the cpu with .to(Device::cpu()) first";
  CHECK_THROWS_WITH_AS(t.flat(0), ("flat" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(read_only.flat(0), ("flat" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(t(1, 2), ("index" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(read_only(1, 2), ("index" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(t.span(), ("span" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(read_only.span(), ("span" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(t.reshape({6}).to_vector(), ("to_vector" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(t.reshape({1, 6}).item(), ("item" + rest).c_str(), Error);
  CHECK(t.data() != nullptr);  // the raw pointer, for kernels, is there
}

TEST_CASE("a GPU leaf takes its seed gradient on the GPU and accumulates further ones there") {
  Var<float> p = param(randn<float>({1}, 6).to(gpu));
  backward(p);
  REQUIRE(p.grad().defined());
  CHECK(p.grad().device() == gpu);
  CHECK(p.grad().to(host).item() == 1.0f);
  backward(p);
  CHECK(p.grad().device() == gpu);
  CHECK(p.grad().to(host).item() == 2.0f);
}

TEST_CASE("an op given inputs on two devices throws naming both") {
  const Var<float> on_host = param(randn<float>({2, 3}, 1));
  const Var<float> on_gpu = param(randn<float>({2, 3}, 2).to(gpu));
  const std::string rest = "; an op takes all its inputs on one device: copy one with .to(device) first";
  CHECK_THROWS_WITH_AS(Var<float>(on_host + on_gpu),
                       ("add(x0, x1): input 0 is on cpu but input 1 is on cuda:0" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(matmul(on_gpu, transpose(on_host)),
                       ("matmul: input 0 is on cuda:0 but input 1 is on cpu" + rest).c_str(), Error);
  CHECK_THROWS_WITH_AS(mse_loss(on_host, on_gpu),
                       ("mse_loss: input 0 is on cpu but input 1 is on cuda:0" + rest).c_str(), Error);
  const Tensor<std::int64_t> labels = rand_int<std::int64_t>({2}, 3, 0, 3).to(gpu);
  CHECK_THROWS_WITH_AS(cross_entropy(on_host, labels),
                       ("cross_entropy: input 0 is on cpu but input 1 is on cuda:0" + rest).c_str(), Error);
  const Var<float> y = sum(on_host);
  CHECK_THROWS_WITH_AS(backward(y, ones<float>({}).to(gpu)),
                       "backward: the seed gradient is on cuda:0 but the output is on cpu", AutodiffError);
}

TEST_CASE("the README's devices example runs") {
  cuda::Stream mine = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
  {
    // ---- from the README ----
    const Device gpu = Device::parse("cuda:0");  // or Device::cuda(0)
    Tensor<bf16> w = randn<bf16>({1024, 1024}, 1);
    Tensor<bf16> w_gpu = w.to(gpu);               // a copy on cuda:0 (w.to(Device::cpu()) is w itself)
    Tensor<bf16> back = w_gpu.to(Device::cpu());  // done when to() returns: back is readable at once
    Tensor<bf16> twin = w_gpu.clone();            // a copy on the device, queued on its stream

    try {
      Tensor<float> huge({std::int64_t{1} << 40}, gpu);  // 4 TiB
    } catch (const OutOfMemoryError& e) {
      // "allocate: out of memory on cuda:0: asked for 4.00 TiB (4398046511104 bytes), 139.10 GiB free of ..."
      std::printf("%s (%zu bytes free)\n", e.what(), e.bytes_free());
    }

    {
      cuda::StreamGuard on_mine(mine, /*device=*/0);  // this thread's work on cuda:0 now goes to `mine`
      Tensor<bf16> x = w.to(gpu);                      // allocated and copied on `mine`, freed on it
    }
    cuda::MemoryStats stats = cuda::memory_stats(0);  // in_use, reserved, device_free, device_total
    // ---- end ----
    CHECK(bitwise_equal(back, w));
    CHECK(bitwise_equal(twin.to(Device::cpu()), w));
    CHECK(stats.in_use >= 2 * w.numel() * sizeof(bf16));
  }
  REQUIRE(cudaStreamSynchronize(mine) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(mine) == cudaSuccess);
}
