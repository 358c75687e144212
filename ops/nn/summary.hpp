// summary(model, input): a table of a model run, like flax's Module.tabulate. It runs model(input) without
// recording gradients and lists each module call in call order: the module's path (the root shows its type), its
// type, the dtype and shape of its inputs and outputs, its own parameters, and the parameter count and bytes of the
// module with its children; then the model's total. A tensor on a GPU shows its device after its dtype and shape
// ("bf16[8,16,128]@cuda:0"); cpu tensors show none.
//
//   std::cout << nn::summary(model, randn<bf16>({8, 16, 128}, 0));
//
// A module shows up when its operator() runs through Module::traced, as every module here does; the root is shown
// even when its own operator() does not.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tapegrad/ops/nn/module.hpp"

namespace tapegrad::nn {

struct SummaryRow {
  std::string path;  // dotted, as parameters() names it; the root's is its type name
  std::string type;
  std::vector<std::string> notes;  // the module's summary_notes() when the call began
  TensorInfos inputs, outputs;
  ParameterList own_parameters;
  std::int64_t parameter_count = 0, parameter_bytes = 0;  // the module with its children
};

struct ModelSummary {
  std::vector<SummaryRow> rows;  // one per call, in the order the calls began
  std::int64_t parameter_count = 0, parameter_bytes = 0;  // every parameter of the model
  // The rows as a text table, with a total row and line.
  std::string table() const;
};

// "12,288 (24.6 KB)": a count with thousands separators, and bytes in decimal units as flax shows them.
std::string format_size(std::int64_t count, std::int64_t bytes);

namespace detail {
// Collects the calls of a run of `root` while it lives (it is the thread's CallObserver).
class SummaryRecorder final : public CallObserver {
 public:
  explicit SummaryRecorder(const Module& root);
  std::size_t begin(const Module& module, TensorInfos inputs) override;
  void end(std::size_t call, TensorInfos outputs) override;
  ModelSummary finish() &&;

 private:
  const Module& root_;
  std::unordered_map<const Module*, std::string> paths_;
  ModelSummary summary_;
  std::vector<const Module*> modules_;  // the module of each row
  std::vector<std::size_t> open_;       // the rows of the calls under way, innermost last
  ObserverScope scope_;
};
}  // namespace detail

template <class M, class T>
  requires std::derived_from<M, Module>
ModelSummary summarize(const M& model, const Var<T>& input) {
  detail::SummaryRecorder recorder(model);
  NoGradGuard no_grad;
  trace_call(model, [&](const Var<T>& x) { return model(x); }, input);
  return std::move(recorder).finish();
}
template <class M, class T>
  requires std::derived_from<M, Module>
ModelSummary summarize(const M& model, const Tensor<T>& input) {
  return summarize(model, constant(input));
}

template <class M, class X> std::string summary(const M& model, const X& input) {
  return summarize(model, input).table();
}

}  // namespace tapegrad::nn
