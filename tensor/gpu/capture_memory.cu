// Device memory during graph capture (see capture_memory.hpp).
#include "tapegrad/tensor/gpu/detail/capture_memory.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"

namespace tapegrad::cuda {

namespace {
std::atomic<int> live_arenas{0};  // none: device_free need not look further
}  // namespace

class CaptureArena {
 public:
  explicit CaptureArena(int device) : device_(device) { ++live_arenas; }
  ~CaptureArena();
  CaptureArena(const CaptureArena&) = delete;
  CaptureArena& operator=(const CaptureArena&) = delete;

  int device() const { return device_; }
  void* allocate(std::size_t bytes);  // bytes rounded up to the alignment
  void release(void* ptr, std::size_t bytes) { free_.emplace(rounded(bytes), ptr); }
  void keep(const Block& outside) { kept_.push_back(outside); }

 private:
  static constexpr std::size_t alignment = 256;             // as the driver's pools align
  static constexpr std::size_t chunk_bytes = std::size_t{64} << 20;
  static std::size_t rounded(std::size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }

  int device_;
  std::vector<void*> chunks_;
  char* next_ = nullptr;  // the unused rest of the newest chunk
  std::size_t left_ = 0;
  std::multimap<std::size_t, void*> free_;  // released blocks by size
  std::vector<Block> kept_;
};

namespace {

// Guards the arenas and the registry; the arenas' work is host bookkeeping (and, rarely, a chunk from the driver).
std::mutex& arena_mutex() {
  static std::mutex* const mutex = new std::mutex;
  return *mutex;
}

// Every live block from an arena, with the arena it returns to: each entry keeps its arena alive.
std::map<void*, std::shared_ptr<CaptureArena>>& registry() {
  static auto* const blocks = new std::map<void*, std::shared_ptr<CaptureArena>>;
  return *blocks;
}

// This thread's capturing arena per device.
thread_local std::vector<std::shared_ptr<CaptureArena>> capturing;

std::shared_ptr<CaptureArena>* capturing_on(int device) {
  const auto index = static_cast<std::size_t>(device);
  if (capturing.size() <= index) capturing.resize(static_cast<std::size_t>(device_count()));
  return capturing[index] ? &capturing[index] : nullptr;
}

}  // namespace

void* CaptureArena::allocate(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  if (const auto fit = free_.lower_bound(size); fit != free_.end()) {  // the smallest released block that fits
    void* ptr = fit->second;
    const std::size_t spare = fit->first - size;
    free_.erase(fit);
    if (spare >= alignment) free_.emplace(spare, static_cast<char*>(ptr) + size);
    return ptr;
  }
  if (left_ < size) {
    // A new chunk from the driver (allowed in a relaxed-mode capture; it is not part of the graph).
    const std::size_t take = std::max(size, chunk_bytes);
    void* chunk = nullptr;
    OnDevice on(device_);
    TAPEGRAD_CUDA_CHECK(cudaMalloc(&chunk, take));
    chunks_.push_back(chunk);
    if (left_ >= alignment) free_.emplace(left_, next_);
    next_ = static_cast<char*>(chunk);
    left_ = take;
  }
  void* ptr = next_;
  next_ += size;
  left_ -= size;
  return ptr;
}

CaptureArena::~CaptureArena() {
  OnDevice on(device_);
  for (void* chunk : chunks_) {
    const cudaError_t err = cudaFree(chunk);  // waits for the device: a replay may still be using it
    if (err != cudaSuccess && err != cudaErrorCudartUnloading && err != cudaErrorContextIsDestroyed) {
      std::fprintf(stderr, "tapegrad: freeing a graph's memory on cuda:%d failed: %s\n", device_,
                   cudaGetErrorString(err));
    }
  }
  for (const Block& b : kept_) device_free(b);
  --live_arenas;
}

std::shared_ptr<CaptureArena> make_capture_arena(int device) {
  check_device_index(device, "graph capture");
  return std::make_shared<CaptureArena>(device);
}

CaptureScope::CaptureScope(int device, std::shared_ptr<CaptureArena> arena) : device_(device) {
  check(capturing_on(device) == nullptr, "graph capture", "this thread is already capturing on cuda:", device);
  capturing[static_cast<std::size_t>(device)] = std::move(arena);
}

CaptureScope::~CaptureScope() { capturing[static_cast<std::size_t>(device_)].reset(); }

std::optional<Block> capture_allocate(std::size_t bytes, int device, Stream stream) {
  std::shared_ptr<CaptureArena>* arena = capturing_on(device);
  if (arena == nullptr) return std::nullopt;
  const std::lock_guard lock(arena_mutex());
  void* ptr = (*arena)->allocate(bytes);
  registry().emplace(ptr, *arena);
  return Block{ptr, bytes, device, stream};
}

CaptureFree capture_free(const Block& block) noexcept {
  if (live_arenas == 0) return CaptureFree::not_captured;
  std::shared_ptr<CaptureArena> owner;  // released after the lock: its destructor may free device memory
  const std::lock_guard lock(arena_mutex());
  auto& blocks = registry();
  if (const auto found = blocks.find(block.ptr); found != blocks.end()) {
    found->second->release(block.ptr, block.bytes);
    owner = std::move(found->second);
    blocks.erase(found);
    return CaptureFree::returned;
  }
  if (std::shared_ptr<CaptureArena>* arena = capturing_on(block.device)) {
    (*arena)->keep(block);
    return CaptureFree::kept;
  }
  return CaptureFree::not_captured;
}

}  // namespace tapegrad::cuda
