// The cuDNN attention entry points of a build that found no cuDNN headers (meson.build): every problem runs on
// tapegrad's own kernels.
#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

std::string cudnn_attention_refusal(DType, const attention::Problem&, bool, int) {
  return "tapegrad was built without cuDNN's headers";
}

bool cudnn_attention_forward(DType, const attention::Problem&, const void*, const void*, const void*, void*, void*,
                             int) {
  return false;
}

bool cudnn_attention_backward(DType, const attention::Problem&, const void*, const void*, const void*, const void*,
                              const void*, const void*, void*, void*, void*, void*, int) {
  return false;
}

std::string cudnn_attention_fp8_refusal(const attention::Problem&, bool, DType, int) {
  return "tapegrad was built without cuDNN's headers";
}

bool cudnn_attention_fp8_forward(const attention::Problem&, const void*, const void*, const void*, void*, void*,
                                 const Fp8AttentionScales&, const Fp8AttentionAmaxes&, int) {
  return false;
}

bool cudnn_attention_fp8_backward(const attention::Problem&, DType, const void*, const void*, const void*,
                                  const void*, const void*, const void*, void*, void*, void*,
                                  const Fp8AttentionScales&, const Fp8AttentionAmaxes&, int) {
  return false;
}

std::string cudnn_attention_outline(DType, const attention::Problem&, bool, DType) {
  throw Error("tapegrad was built without cuDNN's headers");
}

std::int64_t cudnn_attention_candidates_timed() { return 0; }

}  // namespace tapegrad::cuda
