#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <vector>

#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/host_memory.hpp"

namespace bench {

Budget budget;

std::vector<Timing> repeat(std::size_t bodies, const std::function<double(std::size_t)>& once) {
  for (int i = 0; i < budget.warmup; ++i) {
    for (std::size_t k = 0; k < bodies; ++k) once(k);
  }
  std::vector<std::vector<double>> ns(bodies);
  std::vector<double> total(bodies, 0.0);
  auto enough = [&](int rep) {
    if (rep >= budget.max_reps) return true;
    return rep >= budget.min_reps && *std::min_element(total.begin(), total.end()) >= budget.min_seconds * 1e9;
  };
  for (int rep = 0; !enough(rep); ++rep) {
    for (std::size_t k = 0; k < bodies; ++k) {
      ns[k].push_back(once(k));
      total[k] += ns[k].back();
    }
  }
  std::vector<Timing> timings;
  for (auto& v : ns) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    timings.push_back({n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), static_cast<int>(n)});
  }
  return timings;
}

std::vector<Timing> measure(const std::vector<Body>& bodies) {
  using clock = std::chrono::steady_clock;
  return repeat(bodies.size(), [&](std::size_t k) {
    const auto start = clock::now();
    bodies[k].run();
    const auto stop = clock::now();
    if (bodies[k].reset) bodies[k].reset();
    return std::chrono::duration<double, std::nano>(stop - start).count();
  });
}

std::int64_t allocated_bytes() {
  return tapegrad::host_memory_stats().in_use_bytes;
}

JsonLine::JsonLine(std::string_view group) {
  out_ << "{";
  str("group", group);
}
JsonLine::~JsonLine() { std::cout << out_.str() << "}" << std::endl; }

JsonLine& JsonLine::key(std::string_view k) {
  if (out_.tellp() > 1) out_ << ", ";
  out_ << '"' << k << "\": ";
  return *this;
}
JsonLine& JsonLine::str(std::string_view k, std::string_view value) {
  key(k);
  out_ << '"';
  for (const char c : value) {  // escaped: a value may be an error message, with quotes or line breaks
    if (c == '"' || c == '\\') {
      out_ << '\\' << c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out_ << (c == '\n' ? "\\n" : " ");
    } else {
      out_ << c;
    }
  }
  out_ << '"';
  return *this;
}
JsonLine& JsonLine::num(std::string_view k, double value) {
  key(k);
  if (std::isfinite(value)) {
    out_ << value;
  } else {
    out_ << "null";
  }
  return *this;
}
JsonLine& JsonLine::shape(const tapegrad::Shape& s, std::string_view k) {
  key(k);
  out_ << "[";
  for (int i = 0; i < s.rank(); ++i) out_ << (i ? ", " : "") << s[i];
  out_ << "]";
  return *this;
}
JsonLine& JsonLine::timing(const Timing& t) {
  return num("threads", tapegrad::num_threads()).num("reps", t.reps).num("median_ns", t.median_ns).num("min_ns", t.min_ns);
}

}  // namespace bench
