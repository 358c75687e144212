// The recorded chain rule of every elementwise op in f32 (one dtype per file: each is a long compile).
#include "tapegrad/ops/detail/elementwise_graph.hpp"

namespace tapegrad::expr {
TAPEGRAD_RECORDED_OPS(float)
}  // namespace tapegrad::expr
