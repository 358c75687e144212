// What summary() sees of a model run: each module's call reports itself (the module, the dtypes and shapes of its
// inputs and outputs) to the CallObserver active in this thread. With none active, as in training, a call costs
// one thread-local read.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad::nn {

class Module;

struct TensorInfo {
  DType dtype;
  Shape shape;
  Device device{};
};
using TensorInfos = std::vector<TensorInfo>;
// "bf16[8,16,128]" on the cpu, "bf16[8,16,128]@cuda:0" elsewhere
std::string to_string(const TensorInfo& info);

// describe(value, infos) appends what a module's input or output holds: a Var (nothing when undefined), or a pair
// or tuple of them. A module returning its own struct adds an overload next to it (found by ADL).
template <class T> void describe(const Var<T>& v, TensorInfos& infos) {
  if (v.defined()) infos.push_back({v.dtype(), v.shape(), v.device()});
}
template <class A, class B> void describe(const std::pair<A, B>& p, TensorInfos& infos) {
  describe(p.first, infos);
  describe(p.second, infos);
}
template <class... Xs> void describe(const std::tuple<Xs...>& t, TensorInfos& infos) {
  std::apply([&](const auto&... x) { (describe(x, infos), ...); }, t);
}

class CallObserver {
 public:
  virtual ~CallObserver() = default;
  // A call of `module` begins; the returned id is passed to end() when it returns.
  virtual std::size_t begin(const Module& module, TensorInfos inputs) = 0;
  virtual void end(std::size_t call, TensorInfos outputs) = 0;
};

// Makes `observer` this thread's until the scope ends.
class ObserverScope {
 public:
  explicit ObserverScope(CallObserver& observer);
  ~ObserverScope();
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;

 private:
  CallObserver* previous_;
};

CallObserver* active_observer();

// body(inputs...), reported to the active observer as a call of `module`.
template <class Body, class... Inputs> auto trace_call(const Module& module, Body&& body, const Inputs&... inputs) {
  CallObserver* observer = active_observer();
  if (observer == nullptr) return body(inputs...);
  TensorInfos in;
  (describe(inputs, in), ...);
  const std::size_t call = observer->begin(module, std::move(in));
  auto out = body(inputs...);
  TensorInfos described;
  describe(out, described);
  observer->end(call, std::move(described));
  return out;
}

}  // namespace tapegrad::nn
