#include "tapegrad/ops/nn/detail/call_trace.hpp"

namespace tapegrad::nn {

namespace {
thread_local CallObserver* observer_in_thread = nullptr;
}  // namespace

std::string to_string(const TensorInfo& info) {
  std::string s(dtype_name(info.dtype));
  s += '[';
  for (int axis = 0; axis < info.shape.rank(); ++axis) {
    if (axis > 0) s += ',';
    s += std::to_string(info.shape[axis]);
  }
  s += ']';
  return info.device.is_cpu() ? s : s + '@' + info.device.str();
}

ObserverScope::ObserverScope(CallObserver& observer) : previous_(observer_in_thread) {
  observer_in_thread = &observer;
}
ObserverScope::~ObserverScope() { observer_in_thread = previous_; }

CallObserver* active_observer() { return observer_in_thread; }

}  // namespace tapegrad::nn
