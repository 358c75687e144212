// cuDNN's attention graphs (cuda/cudnn_sdpa.hpp) as cuDNN itself checks their form, which needs no GPU: every graph
// finalizes, and the FP8 graphs' operations are in cudnn-frontend 1.23's order, op for op (its fused engines
// recognize a graph by its shape). The expected outlines were read from the frontend's own FP8 graphs, built with
// cuDNN's backend log on (q [2, 4, 256, 128], bshd). Whether an engine runs them, and their results, is
// test_gpu_attention_fp8.cpp's part.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/tensor/core/error.hpp"

using namespace tapegrad;

namespace {

// (2, 4, 256, 128) in the bshd layout, kv_heads kv heads; lengths point at host memory (only their presence counts
// when a graph is built).
attention::Problem problem(std::int64_t kv_heads, bool causal, bool padding) {
  constexpr std::int64_t B = 2, H = 4, S = 256, D = 128;
  static const std::int64_t lengths[B] = {S, S / 2};
  const attention::RowStrides q{.batch = S * H * D, .head = D, .row = H * D},
      kv{.batch = S * kv_heads * D, .head = D, .row = kv_heads * D};
  attention::Problem p{.batch = B, .q_heads = H, .kv_heads = kv_heads, .Sq = S, .Sk = S, .D = D, .Dv = D,
                       .q = q, .k = kv, .v = kv, .o = q};
  p.scale = 0.088;
  p.causal = causal;
  p.bottom_right = false;  // (the frontend's causal mask: top-left)
  if (padding) p.q_lengths = p.kv_lengths = lengths;
  return p;
}

std::string outline(bool backward, std::int64_t kv_heads, bool causal, bool padding, DType dtype = DType::f8e4m3,
                    DType gradients = DType::f8e5m2) {
  return cuda::cudnn_attention_outline(dtype, problem(kv_heads, causal, padding), backward, gradients);
}

// The pieces of the frontend's outlines.
const std::string padding_ops = "index index lt lt and select ", causal_ops = "index index ge select ";
const std::string fp8_product = "mul mul mul reduce_amax";

std::string forward(const std::string& masks) {
  return "matmul mul mul mul " + masks + "reduce_max sub exp reduce_add log add div reduce_amax mul matmul " +
         fp8_product;
}

// group_sums: the kv heads' sums of dv and dk where they are fewer than q's.
std::string backward(const std::string& masks, bool group_sums) {
  const std::string sums = group_sums ? "reduce_add " : "";
  return "mul reduce_add mul mul matmul mul mul mul " + masks + "sub exp mul reshape matmul " + sums + fp8_product +
         " matmul mul mul sub mul mul reduce_amax mul reshape matmul " + fp8_product + " reshape matmul " + sums +
         fp8_product;
}

}  // namespace

TEST_CASE("the FP8 attention graphs are cudnn-frontend's, operation by operation, and cuDNN takes their form") {
  CHECK(outline(false, 2, false, false) == forward(""));
  CHECK(outline(false, 4, true, false) == forward(causal_ops));
  CHECK(outline(false, 4, false, true) == forward(padding_ops));
  CHECK(outline(false, 4, true, true) == forward(padding_ops + causal_ops));
  CHECK(outline(true, 2, false, false, DType::f8e4m3, DType::f8e4m3) == backward("", true));
  CHECK(outline(true, 4, false, false) == backward("", false));
  CHECK(outline(true, 4, true, false) == backward(causal_ops, false));
  CHECK(outline(true, 4, false, true) == backward(padding_ops, false));
  CHECK(outline(true, 4, true, true) == backward(padding_ops + causal_ops, false));
}

TEST_CASE("the bf16 and f16 attention graphs take cuDNN's form check in every mask and head grouping") {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const bool backward : {false, true}) {
      for (const std::int64_t kv_heads : {1, 2, 4}) {
        for (const bool causal : {false, true}) {
          for (const bool padding : {false, true}) {
            CAPTURE(dtype_name(dtype));
            CAPTURE(backward);
            CAPTURE(kv_heads);
            CAPTURE(causal);
            CAPTURE(padding);
            const std::string ops = outline(backward, kv_heads, causal, padding, dtype);
            CHECK(ops.starts_with(backward ? "mul reduce_add mul matmul" : "matmul mul"));
            CHECK((ops.find("select") != std::string::npos) == (causal || padding));
          }
        }
      }
    }
  }
}

TEST_CASE("a graph of a type cuDNN's attention does not take is refused with the type named") {
  CHECK_THROWS_WITH_AS(outline(false, 4, false, false, DType::f32), doctest::Contains("f32"), Error);
}
