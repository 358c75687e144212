// Finding and loading cuDNN (see cudnn_library.hpp).
#include "tapegrad/cuda/cudnn_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"
#include "tapegrad/tensor/gpu/device.hpp"

namespace tapegrad::cuda::cudnn {

namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;
};

// The places tried in order; TAPEGRAD_CUDNN_DIR is where the build found cuDNN (meson.build).
std::vector<std::string> candidates() {
  if (const char* path = std::getenv("TAPEGRAD_CUDNN"); path && *path) return {path};
  std::vector<std::string> paths{"libcudnn.so.9"};
#ifdef TAPEGRAD_CUDNN_DIR
  paths.push_back(std::string(TAPEGRAD_CUDNN_DIR) + "/libcudnn.so.9");
#endif
  return paths;
}

template <class F> bool find(void* library, const char* name, F& to, std::string& why) {
  to = reinterpret_cast<F>(dlsym(library, name));
  if (!to) why = detail::concat("cuDNN has no ", name);
  return to != nullptr;
}

Loaded load() {
  Loaded l;
  void* library = nullptr;
  for (const std::string& path : candidates()) {
    library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library) break;
    const char* error = dlerror();
    l.why += detail::concat(l.why.empty() ? "" : "; ", error ? error : path.c_str());
  }
  if (!library) return l;
  l.why.clear();
  Api& a = l.api;
  const bool found = find(library, "cudnnGetVersion", a.version, l.why) &&
                     find(library, "cudnnGetErrorString", a.error_string, l.why) &&
                     find(library, "cudnnGetLastErrorString", a.last_error, l.why) &&
                     find(library, "cudnnCreate", a.create, l.why) && find(library, "cudnnSetStream", a.set_stream, l.why) &&
                     find(library, "cudnnBackendCreateDescriptor", a.create_descriptor, l.why) &&
                     find(library, "cudnnBackendDestroyDescriptor", a.destroy_descriptor, l.why) &&
                     find(library, "cudnnBackendSetAttribute", a.set_attribute, l.why) &&
                     find(library, "cudnnBackendGetAttribute", a.get_attribute, l.why) &&
                     find(library, "cudnnBackendFinalize", a.finalize, l.why) &&
                     find(library, "cudnnBackendExecute", a.execute, l.why);
  if (!found) return l;  // the library stays loaded: it may be the process's cuDNN, used elsewhere
  if (const std::size_t version = a.version(); version < oldest_version) {
    l.why = detail::concat("cuDNN ", version, " is older than ", oldest_version);
    return l;
  }
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const Api* api() { return loaded().ok ? &loaded().api : nullptr; }

const std::string& unavailable() { return loaded().why; }

cudnnHandle_t handle(int device) {
  static std::vector<std::once_flag> ready(static_cast<std::size_t>(device_count()));
  static std::vector<cudnnHandle_t> handles(static_cast<std::size_t>(device_count()));
  const auto i = static_cast<std::size_t>(device);
  std::call_once(ready[i], [&] {
    OnDevice on(device);
    const cudnnStatus_t status = api()->create(&handles[i]);
    if (status != CUDNN_STATUS_SUCCESS) throw Error(detail::concat("cudnnCreate on cuda:", device, ": ", describe(status)));
  });
  return handles[i];
}

std::string describe(cudnnStatus_t status) {
  char message[1024] = {};
  api()->last_error(message, sizeof message);
  return detail::concat(api()->error_string(status), message[0] ? ": " : "", message);
}

}  // namespace tapegrad::cuda::cudnn
