// Checkpoints. Modules' state dicts (Module::state_dict / load_state_dict, nn::save / nn::load): every parameter and
// buffer by its dotted path, loaded in place in the module's own dtypes (the seed's bug must not come back through
// loading), every problem of a dict reported at once with nothing changed, delayed scaling's state saved and
// restored. Optimizers' state dicts: a run stopped and resumed from its files ends bitwise where the uninterrupted
// one does.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "support.hpp"
#include "tapegrad/ops/nn/nn.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

// Two modules in a tree, for dotted paths: "norm.scale", "mlp.wi_kernel", ...
template <class P> class Block : public nn::Module {
 public:
  Block(std::uint64_t seed, std::optional<fp8::Recipe> recipe = {})
      : Module("Block"),
        norm_(8, {}, nn::derive_seed(seed, "norm")),
        mlp_(8, {.intermediate_dim = 16, .fp8 = recipe}, nn::derive_seed(seed, "mlp")) {
    add_child("norm", norm_);
    add_child("mlp", mlp_);
  }
  template <class T> Var<T> operator()(const Var<T>& x) const {
    return traced([this](const Var<T>& x) { return mlp_(norm_(x)); }, x);
  }
  const nn::LayerNormMLP<P>& mlp() const { return mlp_; }

 private:
  nn::LayerNorm<P> norm_;
  nn::LayerNormMLP<P> mlp_;
};

template <class T> Tensor<T> value_of(const nn::NamedParameter& p) { return std::get<Var<T>>(p.var).value(); }

fs::path temporary_path(const std::string& name) {
  return fs::temp_directory_path() / ("tapegrad-" + std::to_string(::getpid()) + "-" + name);
}

}  // namespace

TEST_CASE("a state dict names every parameter by its path and loads into another module in place, bitwise") {
  const Block<bf16> source(1);
  Block<bf16> target(2);
  const nn::StateDict dict = source.state_dict();
  CHECK(dict.size() == source.parameters().size());
  CHECK(dict.contains("norm.scale"));
  CHECK(dict.contains("mlp.wi_kernel"));
  CHECK(dict.at("mlp.wi_kernel").dtype() == DType::bf16);
  const Var<bf16> held = target.mlp().wi_kernel();  // a handle taken before loading sees the loaded values
  CHECK_FALSE(test::bitwise_equal(held.value(), source.mlp().wi_kernel().value()));
  target.load_state_dict(dict);
  CHECK(test::bitwise_equal(held.value(), source.mlp().wi_kernel().value()));
  for (const nn::NamedParameter& p : target.parameters()) {
    CAPTURE(p.path);
    CHECK(p.dtype() == DType::bf16);
    CHECK(test::bitwise_equal(value_of<bf16>(p), dict.at(p.path).get<bf16>()));
  }
  // The dict shares the parameters' storage; loading copies, so the source's values stay its own.
  CHECK_FALSE(held.value().shares_storage_with(source.mlp().wi_kernel().value()));
}

TEST_CASE("f32 weights load into a bf16 module as bf16 when cast is asked for, and are refused otherwise") {
  const Block<float> f32_source(3);
  Block<bf16> target(4);
  const nn::StateDict dict = f32_source.state_dict();
  const nn::StateDict before = target.state_dict();
  CHECK_THROWS_WITH_AS(target.load_state_dict(dict),
                       doctest::Contains("Block: load_state_dict: 8 problems; 'norm.scale' is f32, the module's is "
                                         "bf16 (LoadOptions::cast rounds it to that)"),
                       Error);
  for (const auto& [path, value] : target.state_dict()) {
    CHECK(test::bitwise_equal(value.get<bf16>(), before.at(path).get<bf16>()));
  }
  target.load_state_dict(dict, {.cast = true});
  for (const nn::NamedParameter& p : target.parameters()) {
    CAPTURE(p.path);
    CHECK(p.dtype() == DType::bf16);
    CHECK(test::bitwise_equal(value_of<bf16>(p), cast<bf16>(dict.at(p.path).get<float>())));
  }
}

TEST_CASE("every problem of a state dict is reported at once, and nothing is loaded") {
  Block<float> target(5);
  nn::StateDict dict = Block<float>(6).state_dict();
  dict.erase("norm.ln_bias");
  dict.erase("mlp.wo_bias");
  dict["extra.weight"] = zeros<float>({2});
  dict["mlp.wi_kernel"] = zeros<float>({8, 3});
  dict["norm.scale"] = zeros<std::int64_t>({8});
  const nn::StateDict before = target.state_dict();
  const std::string expected =
      "Block: load_state_dict: 5 problems; 'norm.scale' is i64, the module's is f32; 'norm.ln_bias' is missing; "
      "'mlp.wi_kernel' has shape [8, 3], the module's is [8, 1, 16]; 'mlp.wo_bias' is missing; 'extra.weight' is "
      "not in the module; nothing was loaded";
  CHECK_THROWS_WITH_AS(target.load_state_dict(dict), expected.c_str(), Error);
  CHECK_THROWS_WITH_AS(target.load_state_dict(dict, {.cast = true}), expected.c_str(), Error);  // i64 never casts
  for (const auto& [path, value] : target.state_dict()) {
    CHECK(test::bitwise_equal(value.get<float>(), before.at(path).get<float>()));
  }
  // Not strict: missing and unexpected entries are skipped, a wrong shape or dtype is still refused.
  CHECK_THROWS_WITH_AS(target.load_state_dict(dict, {.strict = false}),
                       "Block: load_state_dict: 2 problems; 'norm.scale' is i64, the module's is f32; 'mlp.wi_kernel' "
                       "has shape [8, 3], the module's is [8, 1, 16]; nothing was loaded",
                       Error);
  dict.erase("norm.scale");
  dict.erase("mlp.wi_kernel");
  target.load_state_dict(dict, {.strict = false});
  CHECK(test::bitwise_equal(target.mlp().wo_kernel().value(), dict.at("mlp.wo_kernel").get<float>()));
  CHECK(test::bitwise_equal(target.mlp().wi_kernel().value(), before.at("mlp.wi_kernel").get<float>()));
}

TEST_CASE("delayed scaling's state is saved with the module, so a resumed run continues bitwise") {
  const fp8::Recipe recipe = fp8::DelayedScaling{.amax_history_len = 4};
  const Tensor<float> x = randn<float>({5, 8}, 7);
  const auto step = [&](const Block<float>& block) {
    const Var<float> y = block(constant(x));
    backward(sum(square(y)));
    Tape::active().clear();
    return y.value();
  };
  const Block<float> uninterrupted(8, recipe);
  for (int i = 0; i < 3; ++i) step(uninterrupted);
  const fs::path path = temporary_path("fp8.safetensors");
  nn::save(uninterrupted, path, {{"step", "3"}});
  const nn::StateDict saved = uninterrupted.state_dict();
  CHECK(saved.at("mlp.fp8_amax_history").shape() == Shape{fp8::role_count, 4});
  CHECK(saved.at("mlp.fp8_steps").get<std::int64_t>().item() == 2);  // the third step ends at the next forward
  CHECK(saved.at("mlp.fp8_pending").get<std::int64_t>().item() == 1);

  Block<float> resumed(9, recipe);
  nn::load(resumed, path);
  fs::remove(path);
  const fp8::ScalingState& a = *uninterrupted.mlp().fp8_state();
  const fp8::ScalingState& b = *resumed.mlp().fp8_state();
  for (int i = 0; i < 2; ++i) {
    CHECK(test::bitwise_equal(step(resumed), step(uninterrupted)));
    CHECK(a.steps() == b.steps());
    for (fp8::Role role : fp8::roles) {
      CAPTURE(fp8::role_name(role));
      CHECK(a.scale(role) == b.scale(role));
      const auto ha = a.amax_history(role), hb = b.amax_history(role);
      CHECK(std::equal(ha.begin(), ha.end(), hb.begin(), hb.end()));
    }
  }
  // A state of another history length does not take the buffers.
  Block<float> other(10, fp8::DelayedScaling{.amax_history_len = 8});
  CHECK_THROWS_WITH_AS(other.load_state_dict(saved),
                       doctest::Contains("'mlp.fp8_amax_history' has shape [6, 4], the module's is [6, 8]"), Error);
  // Without fp8 the module has no such buffers: strict loading names them.
  Block<float> plain(11);
  CHECK_THROWS_WITH_AS(plain.load_state_dict(saved), doctest::Contains("'mlp.fp8_scale' is not in the module"), Error);
}

TEST_CASE("a run stopped at step k and resumed from its checkpoint ends bitwise where the uninterrupted one does") {
  const Tensor<float> x = randn<float>({6, 8}, 12), target = randn<float>({6, 8}, 13);
  using Make = std::function<std::unique_ptr<optim::Optimizer>(const nn::ParameterList&, double lr)>;
  const std::pair<const char*, Make> optimizers[] = {
      {"SGD", [](const nn::ParameterList& p, double lr) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = lr, .momentum = 0.9, .nesterov = true});
       }},
      {"Adam", [](const nn::ParameterList& p, double lr) {
         return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = lr, .weight_decay = 0.1});
       }},
      {"AdamW", [](const nn::ParameterList& p, double lr) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = lr});
       }},
  };
  for (const auto& [name, make] : optimizers) {
    CAPTURE(name);
    const auto train = [&](const Block<bf16>& block, optim::Optimizer& optimizer, int steps) {
      for (int i = 0; i < steps; ++i) {
        optimizer.zero_grad();
        backward(mse_loss(block(constant(x)), constant(target)));
        optimizer.step();
        Tape::active().clear();
      }
    };
    Block<bf16> uninterrupted(14);
    const auto first = make(uninterrupted.parameters(), 1e-2);
    train(uninterrupted, *first, 3);
    const fs::path model_path = temporary_path("model.safetensors"), state_path = temporary_path("optim.safetensors");
    nn::save(uninterrupted, model_path);
    safetensors::save(state_path, first->state_dict());
    train(uninterrupted, *first, 3);

    Block<bf16> resumed(15);
    const auto second = make(resumed.parameters(), 5e-1);  // the checkpoint's lr replaces this one
    nn::load(resumed, model_path);
    second->load_state_dict(safetensors::load(state_path).tensors);
    fs::remove(model_path);
    fs::remove(state_path);
    train(resumed, *second, 3);
    for (const nn::NamedParameter& p : uninterrupted.parameters()) {
      CAPTURE(p.path);
      CHECK(test::bitwise_equal(resumed.state_dict().at(p.path).get<bf16>(), value_of<bf16>(p)));
    }
    const nn::StateDict a = first->state_dict(), b = second->state_dict();
    CHECK(a.size() == b.size());
    CHECK(a.at("state.mlp.wi_kernel.step").get<std::int64_t>().item() == 6);
    CHECK(b.at("hyperparameters.lr").get<double>().item() == 1e-2);
  }
}

TEST_CASE("an optimizer's state dict with problems is refused at once, naming each entry, and nothing changes") {
  Block<float> block(16);
  optim::Adam adam(block.parameters(), {.lr = 1e-3});
  backward(sum(square(block(constant(randn<float>({2, 8}, 17))))));
  adam.step();
  Tape::active().clear();
  nn::StateDict dict = adam.state_dict();
  CHECK(dict.at("state.norm.scale.exp_avg").dtype() == DType::f32);
  dict.erase("state.norm.scale.exp_avg_sq");
  dict["state.mlp.wo_bias.exp_avg"] = zeros<double>({8});
  dict["hyperparameters.beta1"] = from_vector<double>({1.5}, {});
  dict["state.extra.step"] = from_vector<std::int64_t>({1}, {});
  const nn::StateDict before = adam.state_dict();
  CHECK_THROWS_WITH_AS(adam.load_state_dict(dict),
                       "Adam: load_state_dict: 3 problems; 'state.norm.scale.exp_avg_sq' is missing; "
                       "'state.mlp.wo_bias.exp_avg' is f64 [8], not f32 [8]; 'state.extra.step' is not this "
                       "optimizer's; nothing was loaded",
                       Error);
  dict = before;
  dict["hyperparameters.beta1"] = from_vector<double>({1.5}, {});
  CHECK_THROWS_WITH_AS(adam.load_state_dict(dict),
                       "Adam: load_state_dict: 1 problem; Adam: beta1 must be in [0, 1), got 1.5; nothing was loaded",
                       Error);
  CHECK(adam.options().beta1 == 0.9);
  optim::SGD plain(block.parameters(), {.lr = 0.1});
  nn::StateDict sgd = plain.state_dict();
  sgd["hyperparameters.momentum"] = from_vector<double>({0.9}, {});
  CHECK_THROWS_WITH_AS(plain.load_state_dict(sgd), doctest::Contains("SGD: momentum must be 0, as this optimizer was "
                                                                     "made with, got 0.9"),
                       Error);
}
