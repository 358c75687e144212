// Devices on any machine: naming and parsing them, what asking for a GPU says where there is none, the device
// checks ops share (on stand-in inputs), and the out-of-memory error's message. The GPU itself: test_cuda_memory.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "tapegrad/tapegrad.hpp"
#ifdef TAPEGRAD_HAVE_CUDA
#include "tapegrad/tensor/gpu/device.hpp"
#endif

using namespace tapegrad;

TEST_CASE("devices print as cpu and cuda:N and parse back") {
  CHECK(Device().str() == "cpu");
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda().str() == "cuda:0");
  CHECK(Device::cuda(3).str() == "cuda:3");
  std::ostringstream out;
  out << Device::cuda(1) << " " << Device::cpu();
  CHECK(out.str() == "cuda:1 cpu");

  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::parse("cuda:12") == Device::cuda(12));
  for (const Device d : {Device::cpu(), Device::cuda(0), Device::cuda(7)}) CHECK(Device::parse(d.str()) == d);
  CHECK_FALSE(Device::cuda(0) == Device::cuda(1));
  CHECK_FALSE(Device::cpu() == Device::cuda(0));
}

TEST_CASE("parsing anything but cpu, cuda or cuda:N throws naming the text") {
  CHECK_THROWS_WITH_AS(Device::parse("gpu"),
                       "Device::parse: \"gpu\" is not a device; expected \"cpu\", \"cuda\" or \"cuda:N\" with N >= 0",
                       Error);
  for (const char* text : {"", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda:1x", " cuda", "cuda:1 ",
                           "cuda:99999999999", "cuda0"}) {
    CAPTURE(text);
    const std::string expected = "Device::parse: \"" + std::string(text) + "\" is not a device";
    CHECK_THROWS_WITH_AS(Device::parse(text), doctest::Contains(expected.c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(Device::cuda(-1), "Device::cuda: device index must be non-negative, got -1", Error);
}

TEST_CASE("tensors are on the cpu unless asked, and to() the cpu returns the tensor itself") {
  const Tensor<float> t = arange<float>(5);
  CHECK(t.device() == Device::cpu());
  CHECK(Tensor<float>().device() == Device::cpu());
  CHECK(t.to(Device::cpu()).shares_storage_with(t));
  CHECK(param(t).device() == Device::cpu());
}

TEST_CASE("a cuda tensor where no GPU can be used throws naming the device and why") {
  std::string cuda0, cuda1;  // the errors expected for cuda:0 and cuda:1
#ifndef TAPEGRAD_HAVE_CUDA
  cuda0 = "allocate: device cuda:0 is not available: tapegrad was built without CUDA";
  cuda1 = "allocate: device cuda:1 is not available: tapegrad was built without CUDA";
#else
  const int count = cuda::device_count();
  if (count == 0) {
    cuda0 = "allocate: device cuda:0 is not available: no CUDA device is visible";
    cuda1 = "allocate: device cuda:1 is not available: no CUDA device is visible";
  } else {
    // This machine has a GPU: the device after the last one is what cannot be used.
    const Device missing = Device::cuda(count);
    const std::string visible = count == 1 ? " (1 CUDA device is visible)"
                                           : " (" + std::to_string(count) + " CUDA devices are visible)";
    const std::string expected = "allocate: device " + missing.str() + " does not exist" + visible;
    CHECK_THROWS_WITH_AS(Tensor<float>({2}, missing), expected.c_str(), Error);
    CHECK_THROWS_WITH_AS(arange<float>(3).to(missing), expected.c_str(), Error);
    return;
  }
#endif
  CHECK_THROWS_WITH_AS(Tensor<float>({2}, Device::cuda()), cuda0.c_str(), Error);
  CHECK_THROWS_WITH_AS(Tensor<double>({0}, Device::cuda(1)), cuda1.c_str(), Error);
  CHECK_THROWS_WITH_AS(arange<float>(3).to(Device::cuda()), cuda0.c_str(), Error);
}

namespace {
// A stand-in input on a given device: the device checks only ask an input for its device.
struct On {
  Device where;
  Device device() const { return where; }
};
const On cpu{Device::cpu()}, gpu0{Device::cuda(0)}, gpu1{Device::cuda(1)};
}  // namespace

TEST_CASE("an op given inputs on two devices throws naming both") {
  CHECK_NOTHROW(check_same_device("add", cpu));
  CHECK_NOTHROW(check_same_device("add", gpu1, gpu1, gpu1));
  CHECK_THROWS_WITH_AS(check_same_device("add", cpu, cpu, gpu1),
                       "add: input 0 is on cpu but input 2 is on cuda:1; an op takes all its inputs on one device: "
                       "copy one with .to(device) first",
                       Error);
  CHECK_THROWS_WITH_AS(check_same_device("matmul", gpu0, gpu1),
                       doctest::Contains("matmul: input 0 is on cuda:0 but input 1 is on cuda:1"), Error);
}

TEST_CASE("a step without a GPU path refuses device inputs by name") {
  CHECK_NOTHROW(check_on_cpu("cast", 0, cpu.device()));
  CHECK_THROWS_WITH_AS(check_on_cpu("cast", 0, gpu0.device()),
                       "cast: input 0 is on cuda:0, but this op runs on the cpu only so far; copy it with "
                       ".to(Device::cpu()) first",
                       Error);
  CHECK_THROWS_WITH_AS(check_on_cpu("cast", 3, Device::cuda(2)),
                       doctest::Contains("cast: input 3 is on cuda:2, but this op runs on the cpu only so far"), Error);
}

TEST_CASE("an out-of-memory error states the request exactly and the sizes in binary units") {
  const OutOfMemoryError e("allocate", Device::cuda(0), 2199023255552, 149357487718, 150001732812);
  CHECK(std::string(e.what()) ==
        "allocate: out of memory on cuda:0: asked for 2.00 TiB (2199023255552 bytes), 139.10 GiB free of 139.70 GiB");
  CHECK(e.device() == Device::cuda(0));
  CHECK(e.bytes_requested() == 2199023255552);
  CHECK(e.bytes_free() == 149357487718);
  CHECK(e.bytes_total() == 150001732812);
  CHECK_THROWS_AS(throw e, Error);  // caught by a handler for any tapegrad error

  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(std::size_t{3} << 20) == "3.00 MiB");
  CHECK(format_bytes((std::size_t{5} << 30) + (std::size_t{1} << 29)) == "5.50 GiB");
  CHECK(format_bytes(std::size_t{2048} << 40) == "2.00 PiB");
}
