#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core_test_helpers.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::check_close;
using test::exact;

namespace {

Var<double> scalar_param(double v) { return param(full<double>({}, v)); }

// A one-input op whose backward throws while `fail` is set: a user's op failing in the middle of a pass.
Var<double> flaky(const Var<double>& x, const bool& fail) {
  struct Saved {};
  return custom_op<Saved>(
      "flaky", [](Saved&, const Tensor<double>& in) { return in.clone(); },
      [&fail](const Saved&, const NeedsGrad&, const Tensor<double>& dy) {
        if (fail) throw std::runtime_error("flaky backward");
        return dy;
      },
      x);
}

}  // namespace

TEST_CASE("backward of a scalar seeds it with one") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = scalar_param(3.0);
  Var<double> y = x * x + x;  // dy/dx = 2x + 1
  backward(y);
  REQUIRE(x.grad().defined());
  CHECK(x.grad().item() == 7.0);
  CHECK(x.grad().shape() == Shape{});
}

TEST_CASE("backward with a seed propagates that seed") {
  Tape tape;
  TapeScope scope(tape);
  const Tensor<double> xv = randn<double>({2, 3}, 1), dy = randn<double>({2, 3}, 2);
  Var<double> x = param(xv);
  Var<double> y = x * x;
  backward(y, dy);
  Tensor<double> expected({2, 3});
  for (std::int64_t i = 0; i < 6; ++i) expected.flat(i) = 2 * xv.flat(i) * dy.flat(i);
  check_close(x.grad(), expected, exact);
}

TEST_CASE("backward from a leaf puts the seed in its gradient") {
  Var<double> x = param(zeros<double>({3}));
  backward(x, full<double>({3}, 2.0));
  check_close(x.grad(), full<double>({3}, 2.0), exact);
}

TEST_CASE("a value used twice receives the sum of both gradients") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = scalar_param(2.0);
  Var<double> h = x * 3.0;   // its own node
  Var<double> y = h * h + h;  // h is used by three leaves of one node
  Var<double> z = y + h;      // and by a second node
  backward(z);
  // z = 9x² + 6x, dz/dx = 18x + 6
  CHECK(x.grad().item() == doctest::Approx(42.0));
  CHECK(tape.size() == 3);
}

TEST_CASE("gradients accumulate across two backward calls") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = scalar_param(1.5);
  backward(eval(x * x));
  CHECK(x.grad().item() == 3.0);
  backward(eval(x * 4.0));
  CHECK(x.grad().item() == 7.0);
}

TEST_CASE("a gradient the user kept a copy of keeps its value when later passes add to the variable's") {
  // Gradients are summed in place only where no other tensor shares the sum's memory.
  const Var<double> x = scalar_param(3.0);
  backward(eval(x * 2.0));
  const Tensor<double> first = x.grad();
  backward(eval(x * 5.0));
  CHECK(first.item() == 2.0);
  CHECK(x.grad().item() == 7.0);
  backward(eval(x * 1.0));  // no copy kept now: summed in place, the same result
  CHECK(x.grad().item() == 8.0);
  CHECK(first.item() == 2.0);
}

TEST_CASE("zero_grad clears gradients") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> a = scalar_param(1.0), b = scalar_param(2.0);
  backward(eval(a * b));
  CHECK(a.grad().defined());
  a.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK(b.grad().defined());
  backward(eval(a * b));
  CHECK(a.grad().item() == 2.0);  // starts afresh
  zero_grad(a, b);
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("retain_graph allows a second backward through the same graph") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({4}, 3));
  Var<double> y = sum(exp(x));
  backward(y, {.retain_graph = true});
  const Tensor<double> first = x.grad().clone();
  backward(y);
  check_close(x.grad(), eval(constant(first) * 2.0).value(), exact);
}

TEST_CASE("backward twice without retain throws naming the node and retain_graph") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> a = scalar_param(1.0), b = scalar_param(2.0);
  Var<double> y = a * b;
  backward(y);
  CHECK_THROWS_WITH_AS(backward(y), doctest::Contains("node 'mul(x0, x1)'"), AutodiffError);
  CHECK_THROWS_WITH_AS(backward(y), doctest::Contains("retain_graph"), AutodiffError);
  CHECK(a.grad().item() == 2.0);  // the failed passes added nothing
}

TEST_CASE("backward twice through a custom-op node names it") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({3}, 4));
  Var<double> y = sum(x);
  backward(y);
  CHECK_THROWS_WITH_AS(backward(y), doctest::Contains("'sum'"), AutodiffError);
}

TEST_CASE("backward of a non-scalar without a seed throws naming the shape") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({2, 3}, 5));
  Var<double> y = x * x;
  CHECK_THROWS_WITH_AS(backward(y), doctest::Contains("backward: output of shape [2, 3] is not a scalar"),
                       AutodiffError);
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("a seed of the wrong shape throws naming both shapes") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({2, 3}, 5));
  Var<double> y = x * x;
  CHECK_THROWS_WITH_AS(backward(y, ones<double>({3})),
                       "backward: the seed gradient has shape [3] but the output has shape [2, 3]", AutodiffError);
  CHECK_THROWS_AS(backward(x, ones<double>({3, 2})), AutodiffError);
  // Nothing was left behind: a correct backward still gives the right answer.
  backward(y, ones<double>({2, 3}));
  check_close(x.grad(), eval(constant(x.value()) * 2.0).value(), exact);
}

TEST_CASE("backward of an output that needs no gradient throws") {
  Var<double> c = constant(ones<double>({}));
  CHECK_THROWS_WITH_AS(backward(c), doctest::Contains("does not require grad"), AutodiffError);
  CHECK_THROWS_AS(backward(eval(c * 2.0)), AutodiffError);
}

TEST_CASE("NoGradGuard records nothing") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({3}, 6));
  {
    NoGradGuard no_grad;
    CHECK_FALSE(grad_enabled());
    Var<double> y = x * x + exp(x);
    Var<double> s = sum(y);
    CHECK(tape.size() == 0);
    CHECK_FALSE(y.requires_grad());
    CHECK_FALSE(s.requires_grad());
    CHECK(y.is_leaf());
    {
      NoGradGuard nested;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // the inner guard restores the outer state
  }
  CHECK(grad_enabled());
  Var<double> z = x * x;
  CHECK(tape.size() == 1);
  CHECK(z.requires_grad());
}

TEST_CASE("detach gives a leaf with the same value that no gradient flows through") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({3}, 7));
  Var<double> h = x * 2.0;
  Var<double> d = h.detach();
  CHECK(d.is_leaf());
  CHECK_FALSE(d.requires_grad());
  CHECK(d.value().shares_storage_with(h.value()));
  const std::size_t recorded = tape.size();
  Var<double> c = d * d;  // only constants: nothing is recorded
  CHECK(tape.size() == recorded);
  CHECK_FALSE(c.requires_grad());
  backward(sum(x * d));  // d is a constant here: dL/dx = d
  check_close(x.grad(), d.value(), exact);
}

TEST_CASE("a value from a cleared tape throws when used in a new op or in backward") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({2, 2}, 8));
  Var<double> h = x * x;
  Var<double> s = sum(h);
  tape.clear();
  CHECK(tape.size() == 0);
  CHECK_THROWS_WITH_AS(eval(h * 2.0),
                       doctest::Contains("mul_scalar(x0): operand x0 of shape [2, 2] was recorded on a tape that has "
                                         "since been cleared"),
                       AutodiffError);
  CHECK_THROWS_WITH_AS(sum(h), doctest::Contains("sum: input 0 of shape [2, 2] was recorded on a tape"),
                       AutodiffError);
  CHECK_THROWS_WITH_AS(backward(s), doctest::Contains("recorded on a tape that has since been cleared"),
                       AutodiffError);
  // detach() makes the value usable again.
  Var<double> y = h.detach() * x;
  CHECK(y.requires_grad());
}

TEST_CASE("leaves survive clear and take part in new graphs") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = scalar_param(2.0);
  backward(eval(x * x));
  tape.clear();
  x.zero_grad();
  backward(eval(x * x * x));
  CHECK(x.grad().item() == doctest::Approx(12.0));
}

TEST_CASE("a value from a destroyed tape is detected as stale") {
  Var<double> x = scalar_param(2.0);
  Var<double> h;
  {
    Tape tape;
    TapeScope scope(tape);
    h = x * x;
  }
  CHECK_THROWS_AS(backward(h), AutodiffError);
  CHECK_THROWS_AS(eval(h + 1.0), AutodiffError);
}

TEST_CASE("TapeScope makes a private tape active and restores the previous one") {
  Tape& outer = Tape::active();
  const std::size_t outer_size = outer.size();
  Tape first, second;
  {
    TapeScope a(first);
    CHECK(&Tape::active() == &first);
    Var<double> x = scalar_param(1.0);
    Var<double> y = x * x;
    CHECK(first.size() == 1);
    {
      TapeScope b(second);
      CHECK(&Tape::active() == &second);
      Var<double> z = x + 1.0;
      CHECK(second.size() == 1);
      CHECK(first.size() == 1);
    }
    CHECK(&Tape::active() == &first);
  }
  CHECK(&Tape::active() == &outer);
  CHECK(outer.size() == outer_size);
}

TEST_CASE("each thread records on its own tape") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = scalar_param(1.0);
  std::size_t other_size = 0;
  std::thread worker([&] {
    Tape& own = Tape::active();
    CHECK(&own != &tape);  // doctest assertions from another thread are supported
    const std::size_t before = own.size();
    Var<double> y = x * 3.0;
    other_size = own.size() - before;
    backward(y);
  });
  worker.join();
  CHECK(other_size == 1);
  CHECK(tape.size() == 0);
  CHECK(x.grad().item() == 3.0);
}

TEST_CASE("retain_grad keeps a non-leaf gradient") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({3}, 9));
  Var<double> h = x * 2.0, k = x * 3.0;
  h.retain_grad();
  backward(sum(h * h + k));
  REQUIRE(h.grad().defined());
  check_close(h.grad(), eval(constant(h.value()) * 2.0).value(), exact);  // d(h²)/dh = 2h
  CHECK_FALSE(k.grad().defined());                                     // not retained
}

TEST_CASE("an exception during backward leaves no stale pending gradient") {
  Tape tape;
  TapeScope scope(tape);
  bool fail = true;
  Var<double> x = scalar_param(3.0);
  Var<double> h = x * 2.0;
  Var<double> a = h * 5.0;    // this branch runs first and leaves a gradient pending on h
  Var<double> b = flaky(h, fail);  // this one throws
  Var<double> y = a + b;
  CHECK_THROWS_WITH_AS(backward(y, {.retain_graph = true}), "flaky backward", std::runtime_error);
  fail = false;
  x.zero_grad();
  backward(y, {.retain_graph = true});
  // y = 5h + h = 12x
  CHECK(x.grad().item() == doctest::Approx(12.0));
}

TEST_CASE("a value recorded on another tape cannot be used on this one") {
  Tape first, second;
  Var<double> x = scalar_param(2.0);
  Var<double> h;
  {
    TapeScope scope(first);
    h = x * x;
  }
  TapeScope scope(second);
  // Backward on `second` would never reach h's node on `first`: the gradient of x would silently be lost.
  CHECK_THROWS_WITH_AS(eval(h * 3.0), doctest::Contains("recorded on another tape"), AutodiffError);
  CHECK_THROWS_WITH_AS(sum(h), doctest::Contains("sum: input 0 of shape [] was recorded on another tape"),
                       AutodiffError);
  // Without recording there is no gradient to lose.
  NoGradGuard no_grad;
  CHECK(eval(h * 3.0).value().item() == 12.0);
}

TEST_CASE("backward of an undefined output or with an undefined seed throws naming backward") {
  CHECK_THROWS_WITH_AS(backward(Var<double>()), doctest::Contains("backward: the output is undefined"), Error);
  CHECK_THROWS_WITH_AS(backward(Var<double>(), zeros<double>({2})), doctest::Contains("backward: the output is undefined"),
                       Error);
  Var<double> x = scalar_param(2.0);
  const Var<double> y = x * x;
  CHECK_THROWS_WITH_AS(backward(y, Tensor<double>()),
                       doctest::Contains("backward: the seed gradient is undefined (a default-constructed Tensor"),
                       Error);
  backward(y);  // the refused seed left nothing behind
  CHECK(x.grad().item() == 4.0);
}

TEST_CASE("a Var cannot hold an undefined tensor") {
  CHECK_THROWS_WITH_AS(param(Tensor<float>()), "param: the value is undefined (a default-constructed Tensor, with no storage)",
                       Error);
  CHECK_THROWS_WITH_AS(constant(Tensor<float>()), doctest::Contains("constant: the value is undefined"), Error);
  CHECK_THROWS_WITH_AS(Var<float>(Tensor<float>()), doctest::Contains("Var: the value is undefined"), Error);
  CHECK_THROWS_WITH_AS(Var<float>().shape(), doctest::Contains("Var: the variable is undefined"), Error);
}

namespace {
// A thread that records y = x² on its default tape, hands y over and keeps recording until told to stop.
class RecordingThread {
 public:
  explicit RecordingThread(const Var<double>& x) {
    thread_ = std::thread([this, x] {
      {
        const std::lock_guard lock(mutex_);
        y_ = x * x;
        ready_ = true;
      }
      ready_signal_.notify_one();
      // Records on y's tape while the other thread tries its backward (clearing would make y stale instead).
      for (int i = 0; !stop_ && i < 100000; ++i) Var<double> busy = x * 3.0;
      while (!stop_) std::this_thread::yield();
    });
    std::unique_lock lock(mutex_);
    ready_signal_.wait(lock, [this] { return ready_; });
  }
  ~RecordingThread() {
    stop_ = true;
    thread_.join();
  }
  const Var<double>& y() const { return y_; }

 private:
  std::mutex mutex_;
  std::condition_variable ready_signal_;
  bool ready_ = false;
  std::atomic<bool> stop_ = false;
  Var<double> y_;
  std::thread thread_;
};
}  // namespace

TEST_CASE("backward on a tape another thread is using is refused, however often it is tried") {
  Var<double> x = scalar_param(2.0);
  const RecordingThread other(x);
  for (int attempt = 0; attempt < 2000; ++attempt) {
    CHECK_THROWS_WITH_AS(backward(other.y()),
                         doctest::Contains("backward: the tape is in use by another thread (active there, or running "
                                           "backward); a tape is used by one thread at a time"),
                         AutodiffError);
  }
  CHECK_FALSE(x.grad().defined());  // the refused passes added nothing
  backward(eval(x * 5.0));          // this thread's own tape works as before
  CHECK(x.grad().item() == 5.0);
}

TEST_CASE("a tape another thread is using cannot be made active or cleared here") {
  Tape shared;
  std::mutex mutex;
  std::condition_variable signal;
  bool active = false, done = false;
  std::thread owner([&] {
    const TapeScope scope(shared);
    std::unique_lock lock(mutex);
    active = true;
    signal.notify_all();
    signal.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock lock(mutex);
    signal.wait(lock, [&] { return active; });
  }
  CHECK_THROWS_WITH_AS(TapeScope{shared}, doctest::Contains("TapeScope: the tape is in use by another thread"),
                       AutodiffError);
  CHECK_THROWS_WITH_AS(shared.clear(), doctest::Contains("Tape::clear: the tape is in use by another thread"),
                       AutodiffError);
  {
    const std::lock_guard lock(mutex);
    done = true;
  }
  signal.notify_all();
  owner.join();
  const TapeScope scope(shared);  // free once the other thread's scope ended
  CHECK(&Tape::active() == &shared);
}

TEST_CASE("a tape recorded on in another thread's scope runs backward here once that scope ended") {
  Tape shared;
  Var<double> x = scalar_param(3.0);
  Var<double> y;
  std::thread([&] {
    const TapeScope scope(shared);
    y = x * x;
  }).join();
  backward(y);
  CHECK(x.grad().item() == 6.0);
}

TEST_CASE("backward passes on several threads' own tapes add into shared parameters without losing any") {
  Var<double> w = param(ones<double>({64}));
  const Tensor<double> input = randn<double>({64}, 5);
  constexpr int threads = 4, passes = 200;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < passes; ++i) {
        backward(sum(w * constant(input)));  // dL/dw = input each time
        Tape::active().clear();
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  Tensor<double> want(input.shape());
  for (std::int64_t i = 0; i < want.numel(); ++i) want.flat(i) = threads * passes * input.flat(i);
  check_close(w.grad(), want, {1e-12, 1e-9});
}

TEST_CASE("a gradient hook runs once backward has gone past every node that takes its leaf, in tape order") {
  std::vector<std::string> events;
  const auto logged = [&](const char* name, const Var<double>& x) {
    struct None {};
    return custom_op<None>(
        name, [](None&, const Tensor<double>& v) { return v.clone(); },
        [&events, name](const None&, const NeedsGrad&, const Tensor<double>& dy) {
          events.push_back(name);
          return dy.clone();
        },
        x);
  };
  const Var<double> a = param(randn<double>({3}, 1)), b = param(randn<double>({3}, 2)), unused = param(randn<double>({1}, 3));
  const GradientHook on_a(a, [&] { events.push_back("a ready: " + std::to_string(a.grad().to_vector().size())); });
  const GradientHook on_b(b, [&] { events.push_back("b ready"); });
  const GradientHook on_unused(unused, [&] { events.push_back("unused ready"); });
  const Var<double> first = logged("uses a", a);          // the earliest node that takes a
  const Var<double> second = logged("uses a and b", first * b);
  const Var<double> third = logged("uses a again", second + a);
  backward(sum(third));
  CHECK(events == std::vector<std::string>{"uses a again", "uses a and b", "b ready", "uses a", "a ready: 3"});
  Tape::active().clear();
}
