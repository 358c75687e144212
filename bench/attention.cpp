// (f) The fused attention node nn::dot_product_attention on the CPU, f32, layout bshd: the recorded forward (as in
// training) and forward + backward at small shapes, multi-head causal and not and grouped-query, medians and GFLOP/s
// (bench/attention_step.hpp's count); and the peak extra host memory of a forward + backward step against S, at
// one head: it should grow linearly (extra_bytes / S flat), where one S × S matrix of scores would grow as S².
#include "attention_step.hpp"
#include "bench.hpp"

namespace bench {

namespace {

using namespace tapegrad;

struct Case {
  AttentionShape shape;
  bool causal;
};
constexpr Case cases[] = {
    {{"mha", 4, 256, 8, 8, 64}, false},
    {{"mha", 4, 256, 8, 8, 64}, true},
    {{"gqa", 4, 256, 8, 2, 64}, false},
    {{"gqa", 4, 256, 8, 2, 64}, true},
};

void time_case(const Case& c) {
  const AttentionStep<float> attention(c.shape, c.causal, Device::cpu());
  const std::vector<Timing> t = measure({{[&] {
                                            (void)attention.forward();
                                            Tape::active().clear();
                                          }},
                                         {[&] { attention.step(); }}});
  const double forward_flops = attention_forward_flops(c.shape, c.causal);
  const char* modes[] = {"forward", "forward_backward"};
  const double flops[] = {forward_flops, forward_flops * (1 + attention_backward_over_forward)};
  for (std::size_t m = 0; m < 2; ++m) {
    JsonLine("attention")
        .str("config", c.shape.name)
        .shape({c.shape.B, c.shape.S, c.shape.Hq, c.shape.Hkv, c.shape.D}, "b_s_hq_hkv_d")
        .num("causal", c.causal)
        .str("dtype", "f32")
        .str("mode", modes[m])
        .num("gflops", flops[m] / t[m].median_ns)
        .timing(t[m]);
  }
}

// What a forward + backward step holds at its peak beyond its inputs and output gradient.
void memory_at(std::int64_t S) {
  const AttentionShape shape{"one_head", 1, S, 1, 1, 64};
  const AttentionStep<float> attention(shape, false, Device::cpu());
  const std::int64_t before = allocated_bytes();
  reset_host_memory_peak();
  attention.step();
  const double extra = static_cast<double>(host_memory_stats().peak_in_use_bytes - before);
  JsonLine("attention_memory")
      .shape({shape.B, shape.S, shape.Hq, shape.Hkv, shape.D}, "b_s_hq_hkv_d")
      .str("dtype", "f32")
      .num("peak_extra_bytes", extra)
      .num("peak_extra_bytes_per_token", extra / double(S))
      .num("one_s_by_s_matrix_bytes", double(S) * double(S) * sizeof(float));
}

}  // namespace

void attention() {
  for (const Case& c : cases) time_case(c);
  for (const std::int64_t S : {1024, 2048, 4096}) memory_at(S);
}

}  // namespace bench
