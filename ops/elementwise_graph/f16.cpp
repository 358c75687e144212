// The recorded chain rule of every elementwise op in f16 (one dtype per file: each is a long compile).
#include "tapegrad/ops/detail/elementwise_graph.hpp"

namespace tapegrad::expr {
TAPEGRAD_RECORDED_OPS(::tapegrad::f16)
}  // namespace tapegrad::expr
