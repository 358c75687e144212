// Higher-order gradients at work: a WGAN-GP critic (Gulrajani et al., 2017) learns the Wasserstein-1 distance between
// two Gaussians whose means are 2 apart (so the distance is 2). Its loss holds the norm of the critic's gradient with
// respect to its input (the gradient penalty), so each training step differentiates a gradient: grad(create_graph)
// through Dense layers and the fused layernorm_mlp node, then backward through that. In double on the cpu; at the
// end the penalty's gradient, made of the critic's second derivatives, is checked against central differences.
//
// The penalty λ·(‖∇D‖ − 1)² is soft: the best critic of the penalized loss is D(x) = k·x₀ with k = 1 + 1/λ, whose
// estimate is 2k = 2.2 for λ = 10 with gradient norm k = 1.1. Training approaches those values.
//
//   gradient_penalty
#include <cstdio>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

namespace {

constexpr std::int64_t dims = 4, width = 32;
constexpr double distance = 2.0;  // between the means: real ~ N(2·e₀, I), fake ~ N(0, I)
constexpr double penalty_weight = 10.0;
constexpr double optimal_slope = 1.0 + 1.0 / penalty_weight;  // of the penalized loss's best critic (see above)

// x [N, dims] -> [N, 1]: h = embed(x); h = h + mlp(h); D(x) = head(h).
class Critic : public nn::Module {
 public:
  explicit Critic(std::uint64_t seed)
      : Module("Critic", Device::cpu()),
        embed_(dims, {.features = width}, nn::derive_seed(seed, "embed")),
        mlp_(width, {.intermediate_dim = 2 * width, .activation = Activation::gelu}, nn::derive_seed(seed, "mlp")),
        head_(width, {.features = 1}, nn::derive_seed(seed, "head")) {
    add_child("embed", embed_);
    add_child("mlp", mlp_);
    add_child("head", head_);
  }

  Var<double> operator()(const Var<double>& x) const {
    return traced(
        [this](const Var<double>& x) {
          const Var<double> h = embed_(x);
          return head_(Var<double>(h + mlp_(h)));
        },
        x);
  }

 private:
  nn::Dense<double> embed_;
  nn::LayerNormMLP<double> mlp_;
  nn::Dense<double> head_;
};

// The penalty's ingredient: ‖∇ₓ D(x)‖ per row of x, recorded (differentiable in the critic's parameters and in x).
Var<double> gradient_norms(const Critic& critic, const Var<double>& x) {
  const Var<double> g = grad({sum(critic(x))}, {x}, {.create_graph = true})[0];
  return sqrt(sum(g * g, {1}));
}

struct Batch {
  Tensor<double> real, fake, between;  // `between`: a random point on the segment from each fake to its real
};

Batch draw(std::int64_t n, std::uint64_t seed) {
  NoGradGuard no_grad;
  Tensor<double> shift = zeros<double>({1, dims});
  shift.flat(0) = distance;
  const Var<double> real = constant(randn<double>({n, dims}, 3 * seed)) + constant(shift);
  const Var<double> fake = constant(randn<double>({n, dims}, 3 * seed + 1));
  const Var<double> t = constant(rand_uniform<double>({n, 1}, 3 * seed + 2));
  return {real.value(), fake.value(), Var<double>(t * real + (1.0 - t) * fake).value()};
}

// The critic's loss: E D(fake) − E D(real) + λ E (‖∇D(between)‖ − 1)².
struct Loss {
  Var<double> value, estimate, mean_norm;
};

Loss critic_loss(const Critic& critic, const Batch& batch) {
  const Var<double> estimate = mean(critic(constant(batch.real))) - mean(critic(constant(batch.fake)));
  const Var<double> norms = gradient_norms(critic, param(batch.between));
  const Var<double> penalty = mean(square(norms - 1.0));
  return {penalty * penalty_weight - estimate, estimate, mean(norms)};
}

int train() {
  Critic critic(/*seed=*/5);
  const Batch held_out = draw(4096, 1'000'000);  // where the printed estimate is measured
  std::printf("%s\n", nn::summary(critic, zeros<double>({1, dims})).c_str());
  optim::Adam optimizer(critic.parameters(), {.lr = 2e-3});
  Tape& tape = Tape::active();
  for (int step = 0; step <= 600; ++step) {
    const Loss loss = critic_loss(critic, draw(256, step));
    backward(loss.value);  // through the recorded gradient: second derivatives of the critic
    if (step % 100 == 0) {
      const Loss measured = critic_loss(critic, held_out);
      std::printf("step %3d  Wasserstein-1 estimate %.3f (penalized optimum %.1f)  mean |grad D| %.3f\n", step,
                  measured.estimate.value().item(), distance * optimal_slope, measured.mean_norm.value().item());
    }
    optimizer.step();
    optimizer.zero_grad();
    tape.clear();
  }

  // The penalty's gradient with respect to the points and every parameter, against central differences.
  const nn::ParameterList paths = critic.parameters();
  std::vector<Tensor<double>> values{draw(3, 2'000'000).between};
  for (const nn::NamedParameter& p : paths) values.push_back(std::get<Var<double>>(p.var).value().clone());
  const GradcheckResult result = gradcheck(
      [&](const std::vector<Var<double>>& in) {
        for (std::size_t i = 0; i < paths.size(); ++i) critic.set_parameter(paths[i].path, in[i + 1]);
        return mean(square(gradient_norms(critic, in[0]) - 1.0));
      },
      values, {.fast_mode = true});
  std::printf("gradcheck of the penalty (second derivatives of the critic): %s\n", result.report.c_str());
  return result ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return train();
  } catch (const Error& e) {
    std::fprintf(stderr, "gradient_penalty: %s\n", e.what());
    return 2;
  }
}
