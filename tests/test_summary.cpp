// summary(): one row per module call in call order with paths, types, input and output dtypes and shapes, own
// parameters and sizes with children; totals that add up; formatting of counts and bytes.
#include <doctest/doctest.h>

#include <string>

#include "project_attend.hpp"
#include "module_support.hpp"

using namespace tapegrad;

namespace {

// Applies one Dense twice, and does not trace its own calls: summary() must still show the root once.
class Twice : public nn::Module {
 public:
  Twice() : Module("Twice"), dense_(4, {.features = 4}, 0) { add_child("dense", dense_); }
  template <class T> Var<T> operator()(const Var<T>& x) const { return dense_(dense_(x)); }

 private:
  nn::Dense<float> dense_;
};

// Calls a module that it did not register, and asks its child for the norm output too.
class Unregistered : public nn::Module {
 public:
  Unregistered() : Module("Unregistered"), proj_(4, {.dense = {.features = 3}}, 0) { add_child("proj", proj_); }
  template <class T> Var<T> operator()(const Var<T>& x) const {
    return traced(
        [this](const Var<T>& x) {
          const nn::Dense<T> stray(3, {.features = 2}, 1);
          return stray(proj_.with_layernorm_output(x).output);
        },
        x);
  }

 private:
  nn::LayerNormDense<float> proj_;
};

std::vector<std::string> row_paths(const nn::ModelSummary& s) {
  std::vector<std::string> out;
  for (const auto& row : s.rows) out.push_back(row.path);
  return out;
}

}  // namespace

TEST_CASE("summarize lists every module call in call order with its inputs, outputs and parameters") {
  const examples::ProjectAttend<bf16> model(16, {.num_heads = 2, .head_dim = 4}, 0);
  const nn::ModelSummary s = nn::summarize(model, randn<bf16>({2, 5, 16}, 1));
  CHECK(row_paths(s) == std::vector<std::string>{"ProjectAttend", "proj", "attn", "attn.qkv", "attn.out"});
  const auto& qkv = s.rows[3];
  CHECK(qkv.type == "LayerNormDense");
  REQUIRE(qkv.inputs.size() == 1);
  CHECK(nn::to_string(qkv.inputs[0]) == "bf16[2,5,16]");
  REQUIRE(qkv.outputs.size() == 1);
  CHECK(nn::to_string(qkv.outputs[0]) == "bf16[2,5,24]");
  REQUIRE(qkv.own_parameters.size() == 4);
  CHECK(qkv.own_parameters[2].path == "kernel");
  CHECK(qkv.parameter_count == 16 + 16 + 16 * 24 + 24);
  CHECK(qkv.parameter_bytes == 2 * qkv.parameter_count);
  CHECK(nn::to_string(s.rows[4].inputs[0]) == "bf16[2,5,8]");
  CHECK(s.rows[0].own_parameters.empty());

  std::int64_t count = 0, bytes = 0;
  for (const auto& p : model.parameters()) {
    count += p.numel();
    bytes += p.bytes();
  }
  CHECK(s.parameter_count == count);
  CHECK(s.parameter_bytes == bytes);
  CHECK(s.rows[0].parameter_count == count);
  CHECK(s.rows[1].parameter_count + s.rows[2].parameter_count == count);
  CHECK(s.rows[3].parameter_count + s.rows[4].parameter_count == s.rows[2].parameter_count);
}

TEST_CASE("the summary table shows every path, dtype, parameter and size, and the total") {
  const examples::ProjectAttend<float, bf16> model(16, {.num_heads = 2, .head_dim = 4}, 0);
  const nn::ModelSummary s = nn::summarize(model, randn<float>({2, 5, 16}, 1));
  const std::string table = s.table();
  CAPTURE(table);
  for (const char* text : {"| ProjectAttend ", "| proj ", "| attn ", "| attn.qkv ", "| attn.out ", "MultiHeadAttention",
                           "| f32[2,5,16] ", "| bf16[2,5,16] ", "| bf16[2,5,24] ", "| bf16[2,5,8] ",
                           "| kernel: f32[16,24] ", "| ln_bias: f32[16] ", "| kernel: f32[8,16] "}) {
    CAPTURE(text);
    CHECK(table.find(text) != std::string::npos);
  }
  for (const auto& row : s.rows) {
    CHECK(table.find(nn::format_size(row.parameter_count, row.parameter_bytes) + " |") != std::string::npos);
  }
  const std::string total = nn::format_size(s.parameter_count, s.parameter_bytes);
  const std::size_t total_row = table.find("Total |");
  REQUIRE(total_row != std::string::npos);
  CHECK(table.substr(total_row, table.find('\n', total_row) - total_row).ends_with(total + " |"));
  CHECK(table.find("Total parameters: " + total + "\n") != std::string::npos);
  CHECK(nn::summary(model, randn<float>({2, 5, 16}, 1)) == table);
}

TEST_CASE("format_size groups thousands and shows bytes in decimal units") {
  CHECK(nn::format_size(12288, 24576) == "12,288 (24.6 KB)");
  CHECK(nn::format_size(0, 0) == "0 (0 B)");
  CHECK(nn::format_size(250, 1000) == "250 (1,000 B)");
  CHECK(nn::format_size(1234567, 4938268) == "1,234,567 (4.9 MB)");
  CHECK(nn::format_size(2000000000, 4000000000) == "2,000,000,000 (4.0 GB)");
}

TEST_CASE("a tensor's description shows its device after dtype and shape unless it is on the cpu") {
  CHECK(nn::to_string({DType::bf16, {8, 16}, Device::cpu()}) == "bf16[8,16]");
  CHECK(nn::to_string({DType::f32, {3}, Device::cuda(1)}) == "f32[3]@cuda:1");
}

TEST_CASE("a module called twice has two rows, and a root that does not trace itself still has one") {
  const Twice model;
  const nn::ModelSummary s = nn::summarize(model, randn<float>({3, 4}, 1));
  CHECK(row_paths(s) == std::vector<std::string>{"Twice", "dense", "dense"});
  CHECK(nn::to_string(s.rows[0].outputs[0]) == "f32[3,4]");
}

TEST_CASE("a traced root has one row; an unregistered module is marked; both outputs of a norm call are shown") {
  const Unregistered model;
  const nn::ModelSummary s = nn::summarize(model, randn<float>({3, 4}, 1));
  CHECK(row_paths(s) == std::vector<std::string>{"Unregistered", "proj", "(unregistered)"});
  REQUIRE(s.rows[1].outputs.size() == 2);
  CHECK(nn::to_string(s.rows[1].outputs[0]) == "f32[3,3]");
  CHECK(nn::to_string(s.rows[1].outputs[1]) == "f32[3,4]");
  CHECK(s.rows[2].parameter_count == 3 * 2 + 2);
}

TEST_CASE("summary records nothing on the tape and leaves no observer behind") {
  const examples::ProjectAttend<float> model(8, {.num_heads = 2}, 0);
  const std::size_t before = Tape::active().size();
  nn::summarize(model, randn<float>({1, 3, 8}, 1));
  CHECK(Tape::active().size() == before);
  CHECK(nn::active_observer() == nullptr);
  model(param(randn<float>({1, 3, 8}, 1)));
  CHECK(Tape::active().size() > before);
}
