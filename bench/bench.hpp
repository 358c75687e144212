// What every micro-benchmark here shares: timing (steady_clock, warm-up, median of repetitions), one JSON object
// per measurement on stdout, and the bytes the allocator holds.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/tensor/shape.hpp"

namespace bench {

struct Timing {
  double median_ns = 0, min_ns = 0;
  int reps = 0;
};

struct Budget {
  int warmup = 2;            // untimed rounds first
  int min_reps = 9;          // then at least this many timed rounds,
  double min_seconds = 0.4;  // and more until each body has had this much time measured,
  int max_reps = 2000;       // but no more than this
};
extern Budget budget;  // --quick shrinks it

// Something to time: `run` is timed, `reset` (if any) runs untimed after each repetition.
struct Body {
  std::function<void()> run;
  std::function<void()> reset = {};
};

// Times the bodies round-robin, one repetition of each per round, so that the load of a shared machine changes
// under all of them alike; the timings are in the bodies' order.
std::vector<Timing> measure(const std::vector<Body>& bodies);
// The same schedule (warm-up, repetitions per the budget, round-robin) for bodies that time themselves: once(k)
// runs body k once and returns its nanoseconds (e.g. between two CUDA events).
std::vector<Timing> repeat(std::size_t bodies, const std::function<double(std::size_t)>& once);
inline Timing measure(const std::function<void()>& run) { return measure({Body{run}})[0]; }

// Bytes held by live tensors, as tapegrad's host allocator counts them (blocks in its cache are not held).
std::int64_t allocated_bytes();

// One JSON object on one line, written to stdout when it goes out of scope:
//   JsonLine("matmul").str("impl", "openblas").shape({512, 512}).num("gflops", 93.1);
class JsonLine {
 public:
  explicit JsonLine(std::string_view group);
  ~JsonLine();
  JsonLine(const JsonLine&) = delete;
  JsonLine& operator=(const JsonLine&) = delete;

  JsonLine& str(std::string_view key, std::string_view value);
  JsonLine& num(std::string_view key, double value);
  JsonLine& shape(const tapegrad::Shape& shape, std::string_view key = "shape");
  JsonLine& timing(const Timing& t);  // median_ns, min_ns, reps, threads

 private:
  JsonLine& key(std::string_view k);
  std::ostringstream out_;
};

// The groups of measurements, each in its own file.
void tape_overhead();
void fusion();
void matmul();
void layernorm_mlp();
void adjoint();
void higher_order();
void attention();
// Builds with CUDA only:
void gpu_matmul();
void gpu_bandwidth();
void gpu_layernorm_mlp();
void gpu_higher_order();
void gpu_attention();
void gpu_attention_fp8();
void gpu_transformer_layer();

}  // namespace bench
