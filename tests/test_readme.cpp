// The README's examples, compiled and run, so that the user's manual stays true.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "project_attend.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {
struct Saved {
  Tensor<double> x;
};
Var<double> cube(const Var<double>& x) {
  return custom_op<Saved>(
      "cube",
      [](Saved& s, const Tensor<double>& x) {
        s.x = x;
        Tensor<double> y(x.shape());
        for (std::int64_t i = 0; i < x.numel(); ++i) y.flat(i) = x.flat(i) * x.flat(i) * x.flat(i);
        return y;
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<double>& dy) {
        Tensor<double> dx(s.x.shape());
        for (std::int64_t i = 0; i < dx.numel(); ++i) dx.flat(i) = 3 * s.x.flat(i) * s.x.flat(i) * dy.flat(i);
        return dx;
      },
      x);
}
}  // namespace

TEST_CASE("the README tour runs and fills the gradients") {
  Var<float> x = param(randn<float>({32, 64}, /*seed=*/1));
  Var<float> w = param(randn<float>({64, 16}, 2, 0.0, 0.1));
  Var<float> b = param(zeros<float>({16}));
  Var<float> gamma = param(ones<float>({64})), beta = param(zeros<float>({64}));

  const std::size_t before = Tape::active().size();
  Var<float> h = gelu(matmul(layernorm(x, gamma, beta), w) + b);
  Var<float> loss = mean(square(h));
  CHECK(Tape::active().size() - before == 5);  // layernorm, matmul, gelu(+b), square, mean
  backward(loss);
  CHECK(w.grad().shape() == Shape{64, 16});
  CHECK(gamma.grad().defined());
  Tape::active().clear();
  CHECK(w.grad().defined());
}

TEST_CASE("the README's custom cube op passes the README's gradcheck") {
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return cube(in[0]) * in[1]; },
                  {randn<double>({3, 4}, 1), randn<double>({4}, 2)}));
}

TEST_CASE("the README's initializers make bf16 parameters directly") {
  Tensor<bf16> w = Initializer::he_normal().make<bf16>({256, 1024}, /*seed=*/1);
  CHECK(w.dtype() == DType::bf16);
  Tensor<bf16> stacked =
      Initializer::glorot_uniform().make<bf16>({64, 2, 96}, 2, {.in = {0}, .out = {2}, .batch = {1}});
  CHECK(stacked.shape() == Shape{64, 2, 96});
  CHECK(Initializer::he_normal().name() == "he_normal = variance_scaling(2, fan_in, truncated_normal)");
}

TEST_CASE("the README's layernorm_mlp example records one node and gives f32 gradients") {
  const std::int64_t H = 256, F = 1024;
  Var<bf16> x = param(randn<bf16>({4, 16, H}, 1));
  Var<float> gamma = param(ones<float>({H})), beta = param(zeros<float>({H}));
  Var<float> w1 = param(Initializer::lecun_normal().make<float>({H, 2, F}, 2, {.in = {0}, .out = {2}, .batch = {1}}));
  Var<float> w2 = param(Initializer::lecun_normal().make<float>({F, H}, 3));
  Var<float> b1 = param(zeros<float>({2, F})), b2 = param(zeros<float>({H}));

  const std::size_t before = Tape::active().size();
  auto [y, h] = layernorm_mlp(x, gamma, beta, {w1, w2}, {b1, b2},
                              {.activation = Activation::swiglu,
                               .return_layernorm_output = true,
                               .recompute = Recompute::recompute_norm});
  CHECK(Tape::active().size() - before == 1);
  CHECK(y.shape() == Shape{4, 16, H});
  CHECK(h.dtype() == DType::bf16);
  backward(sum(y));
  CHECK(w1.grad().shape() == Shape{H, 2, F});
  CHECK(x.grad().defined());
  Tape::active().clear();
}

TEST_CASE("the README's modules example: bf16 parameters stay bf16, mixed precision sends f32 gradients") {
  examples::ProjectAttend<bf16> model(128, {.num_heads = 8, .head_dim = 128, .causal = true}, /*seed=*/0);
  Var<bf16> y = model(constant(randn<bf16>({8, 16, 128}, 1)));  // bf16 [8, 16, 128]
  CHECK(y.shape() == Shape{8, 16, 128});
  for (const nn::NamedParameter& p : model.parameters()) CHECK(p.dtype() == DType::bf16);

  examples::ProjectAttend<float, bf16> mixed(128, {.num_heads = 8, .head_dim = 128}, 0);
  Var<bf16> z = mixed(constant(randn<float>({8, 16, 128}, 1)));
  backward(mean(z));
  for (const nn::NamedParameter& p : mixed.parameters()) CHECK(std::get<Var<float>>(p.var).grad().defined());

  CHECK(nn::summary(model, randn<bf16>({8, 16, 128}, 1)).find("| attn.qkv ") != std::string::npos);
  optim::AdamW optimizer(mixed.parameters(), {.lr = 1e-3});
  const Tensor<float> before = std::get<Var<float>>(mixed.parameters()[0].var).value().clone();
  optimizer.step();
  CHECK_FALSE(test::bitwise_equal(before, std::get<Var<float>>(mixed.parameters()[0].var).value()));
}

TEST_CASE("the README's attention example: one node, and a TransformerLayer in bf16 compute") {
  const std::int64_t B = 2, S = 8, step = 3;
  const Var<bf16> q = param(randn<bf16>({B, 32, S, 128}, 1)), k = param(randn<bf16>({B, 8, S, 128}, 2)),
                  v = param(randn<bf16>({B, 8, S, 128}, 3));
  const std::size_t nodes = Tape::active().size();
  Var<bf16> o = nn::dot_product_attention(q, k, v, {.causal = true, .dropout = 0.1, .dropout_seed = step});
  CHECK(Tape::active().size() == nodes + 1);
  CHECK(o.shape() == Shape{B, 32, S, 128});
  nn::TransformerLayer<float, bf16> layer(1024, {.num_heads = 16, .num_kv_heads = 4, .ffn_dim = 4096,
                                                 .rope = nn::RopeOptions{}}, /*seed=*/0);
  const Var<float> x = constant(randn<float>({B, S, 1024}, 4));
  Var<bf16> h = layer(x, {.dropout_seed = step});
  CHECK(h.shape() == Shape{B, S, 1024});
  backward(mean(h));
  for (const nn::NamedParameter& p : layer.parameters()) CHECK(std::get<Var<float>>(p.var).grad().defined());
  Tape::active().clear();
}

TEST_CASE("the README's safetensors example saves and loads bf16 and f32 tensors by name") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("tapegrad-readme-" + std::to_string(::getpid()) + ".safetensors");
  const Tensor<bf16> kernel = randn<bf16>({16, 64}, 1);
  const Tensor<float> bias = zeros<float>({64});
  safetensors::save(path, {{"fc1.kernel", kernel}, {"fc1.bias", bias}}, {{"format", "pt"}});

  const safetensors::File file = safetensors::load(path);  // every tensor (pass a Device to load onto a GPU)
  const Tensor<bf16>& loaded = file.tensors.at("fc1.kernel").get<bf16>();

  const safetensors::MappedFile mapped(path);  // the file mapped, its header checked; no tensor read yet
  const AnyTensor one = mapped.tensor("fc1.bias");  // one tensor copied out (to a GPU straight from the mapping)

  CHECK(loaded.to_vector() == kernel.to_vector());
  CHECK(one.get<float>().to_vector() == bias.to_vector());
  CHECK(file.metadata.at("format") == "pt");
  std::filesystem::remove(path);
}

TEST_CASE("the README's checkpoint example resumes a module and its optimizer from two files") {
  const std::string tag = std::to_string(::getpid());
  const std::filesystem::path model_file = std::filesystem::temp_directory_path() / ("model-" + tag + ".safetensors");
  const std::filesystem::path optimizer_file =
      std::filesystem::temp_directory_path() / ("optimizer-" + tag + ".safetensors");
  const nn::LayerNormMLP<bf16> trained(8, {.intermediate_dim = 16}, 1);
  optim::AdamW trained_optimizer(trained.parameters(), {.lr = 1e-2});
  backward(sum(square(trained(constant(randn<float>({4, 8}, 2))))));
  trained_optimizer.step();
  Tape::active().clear();
  {
    const nn::LayerNormMLP<bf16>& model = trained;
    const optim::AdamW& optimizer = trained_optimizer;
    nn::save(model, model_file);
    safetensors::save(optimizer_file, optimizer.state_dict());
  }
  nn::LayerNormMLP<bf16> model(8, {.intermediate_dim = 16}, 3);  // the same architecture, another seed
  optim::AdamW optimizer(model.parameters(), {.lr = 1e-2});
  nn::load(model, model_file);
  optimizer.load_state_dict(safetensors::load(optimizer_file).tensors);
  CHECK(model.wi_kernel().value().to_vector() == trained.wi_kernel().value().to_vector());
  CHECK(optimizer.state_dict().at("state.wi_kernel.step").get<std::int64_t>().item() == 1);
  std::filesystem::remove(model_file);
  std::filesystem::remove(optimizer_file);
}

TEST_CASE("the README's micro-batch example quantizes the kernel once per optimizer step") {
  Var<float> kernel = param(randn<float>({64, 32}, 1, 0.0, 0.1)), bias = param(zeros<float>({32}));
  optim::AdamW optimizer({kernel, bias});
  Fp8Quantization q = fp8_quantization(fp8::CurrentScaling{});
  q.weight_cache = std::make_shared<fp8::WeightCache>();
  for (std::uint64_t micro_batch = 0; micro_batch < 4; ++micro_batch) {  // the kernel is quantized once
    backward(mean(square(fp8_dense(constant(randn<float>({16, 64}, micro_batch)), kernel, bias, q))));
  }
  optimizer.step();
  q.weight_cache->clear();  // the weights changed in place: the next forward quantizes them again
  CHECK(q.weight_cache->copies_made() == 1);
  CHECK(kernel.grad().defined());
}
