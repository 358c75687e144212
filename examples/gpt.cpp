// A small GPT: a token embedding (the one-hot tokens times a Dense kernel), TransformerLayers with grouped-query
// attention and rotary embeddings, a final norm and an LM head; parameters in bf16, compute in f32 (the founding
// bug report's mix). Trained with AdamW to continue sequences that repeat a random pattern: once a pattern has been
// seen, attention can read the next token five positions back. Prints the summary, the loss as it falls and the
// accuracy on the tokens the context determines; exits 1 unless the model has learned them.
//
//   gpt [cpu|cuda|cuda:N]     where to train (default cpu); a device that cannot be used exits with status 2
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

namespace {

constexpr std::int64_t vocab = 12, period = 5, length = 24, batch = 16, hidden = 48;

// tokens [B, S] (one-hot [B, S, vocab]) -> logits [B, S, vocab].
template <class P, class C> class GPT : public nn::Module {
 public:
  GPT(std::int64_t layers, const nn::TransformerLayerConfig& layer, std::uint64_t seed, Device device)
      : Module("GPT", device),
        embed_(vocab, {.features = hidden, .use_bias = false}, nn::derive_seed(seed, "embed"), device),
        norm_(hidden, {}, nn::derive_seed(seed, "norm"), device),
        head_(hidden, {.features = vocab}, nn::derive_seed(seed, "head"), device) {
    add_child("embed", embed_);
    for (std::int64_t i = 0; i < layers; ++i) {
      const std::string name = "layer" + std::to_string(i);
      layers_.push_back(std::make_unique<nn::TransformerLayer<P, C>>(hidden, layer, nn::derive_seed(seed, name), device));
      add_child(name, *layers_.back());
    }
    add_child("norm", norm_);
    add_child("head", head_);
  }

  template <class T> Var<C> operator()(const Var<T>& one_hot) const {
    return traced(
        [this](const Var<T>& one_hot) {
          Var<C> h = embed_(one_hot);
          for (const auto& layer : layers_) h = (*layer)(h);
          return head_(norm_(h));
        },
        one_hot);
  }

 private:
  nn::Dense<P, C> embed_;
  std::vector<std::unique_ptr<nn::TransformerLayer<P, C>>> layers_;
  nn::LayerNorm<P, C> norm_;
  nn::Dense<P, C> head_;
};

// A batch of sequences, each a random pattern of `period` tokens repeated: the inputs one-hot [B, S, vocab] and the
// next tokens [B, S].
struct Batch {
  Tensor<float> one_hot;
  Tensor<std::int64_t> next;
};

Batch make_batch(std::mt19937_64& random) {
  std::uniform_int_distribution<std::int64_t> token(0, vocab - 1);
  Batch b{zeros<float>({batch, length, vocab}), Tensor<std::int64_t>({batch, length})};
  for (std::int64_t i = 0; i < batch; ++i) {
    std::vector<std::int64_t> pattern(period);
    for (std::int64_t& t : pattern) t = token(random);
    for (std::int64_t s = 0; s < length; ++s) {
      b.one_hot(i, s, pattern[s % period]) = 1.0f;
      b.next(i, s) = pattern[(s + 1) % period];
    }
  }
  return b;
}

// The share of the determined next tokens (positions from period - 1 on) that the logits rank first.
double accuracy(const Tensor<float>& logits, const Tensor<std::int64_t>& next) {
  std::int64_t right = 0, counted = 0;
  for (std::int64_t i = 0; i < batch; ++i) {
    for (std::int64_t s = period - 1; s < length; ++s) {
      std::int64_t best = 0;
      for (std::int64_t v = 1; v < vocab; ++v) best = logits(i, s, v) > logits(i, s, best) ? v : best;
      right += best == next(i, s);
      ++counted;
    }
  }
  return static_cast<double>(right) / static_cast<double>(counted);
}

int train(Device device) {
  (void)Tensor<float>({1}, device);  // throws, saying why, when the device cannot be used
  std::printf("training on %s\n", device.str().c_str());
  const nn::TransformerLayerConfig layer{.num_heads = 4, .num_kv_heads = 2, .ffn_dim = 96,
                                         .activation = Activation::swiglu, .rope = nn::RopeOptions{}};
  GPT<bf16, float> model(2, layer, /*seed=*/3, device);
  std::mt19937_64 random(11);
  std::printf("%s\n", nn::summary(model, make_batch(random).one_hot.to(device)).c_str());

  optim::AdamW optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 1e-4});
  Tape& tape = Tape::active();
  double last_accuracy = 0;
  for (int step = 0; step <= 300; ++step) {
    const Batch b = make_batch(random);
    const Var<float> logits = model(constant(b.one_hot.to(device)));
    const Var<float> loss = cross_entropy(logits, b.next.to(device));
    backward(loss);
    if (step % 50 == 0) {
      last_accuracy = accuracy(logits.value().to(Device::cpu()), b.next);
      std::printf("step %3d  loss %.3f  accuracy on determined tokens %.3f\n", step,
                  loss.value().to(Device::cpu()).item(), last_accuracy);
    }
    optimizer.step();
    optimizer.zero_grad();
    tape.clear();
  }
  const bool learned = last_accuracy >= 0.95;
  std::printf("%s\n", learned ? "learned to continue the patterns" : "did not learn the patterns");
  return learned ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(Device::parse(argc > 1 ? argv[1] : "cpu"));
  } catch (const Error& e) {
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 2;
  }
}
