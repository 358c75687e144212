// dot_product_attention's CPU kernels (ops/attention.cpp): the FlashAttention algorithm. The forward
// walks the keys in blocks with an online softmax (each query row keeps its running max and sum, and rescales its
// accumulator when the max grows), so no Sq × Sk tensor exists; it saves O and each row's log-sum-exp. The backward
// recomputes the probabilities block by block from the log-sum-exp:
//
//   P = exp(S - lse),  S = scale·Q·Kᵀ + bias (masked: -inf)      Z: dropout's kept mask over 1 - dropout
//   dV = (P∘Z)ᵀ·dO    dS = P∘((dO·Vᵀ)∘Z - δ), δ = rowsum(dO∘O)    dK = scale·dSᵀ·Q    dQ = scale·dS·K    dbias = dS
//
// in two passes, so that each gradient row is summed by one task in a fixed order (no atomics: the same bits on
// every run and thread count): one over blocks of keys of a kv head (dK, dV; the q heads of a group in order), one
// over blocks of queries (dQ, and dbias with the heads and batches a broadcast bias serves in order). Block products
// run as Eigen matrix products in C = compute_t<T>; every result is rounded to T once. A query that sees no key gets
// zeros and a log-sum-exp of -inf.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tapegrad/cuda/attention_problem.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::nn::detail {

template <class C> using Block = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class C> using Column = Eigen::Matrix<C, Eigen::Dynamic, 1>;

inline constexpr std::int64_t attention_query_block = 32, attention_key_block = 64;

// Every query's key range, from the problem's mask rules, computed once per call.
class KeyRanges {
 public:
  explicit KeyRanges(const attention::Problem& p) : Sq_(p.Sq), begin_(p.batch * p.Sq), end_(p.batch * p.Sq) {
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t i = 0; i < p.Sq; ++i) p.key_range(b, i, begin_[b * Sq_ + i], end_[b * Sq_ + i]);
    }
  }
  std::int64_t begin(std::int64_t b, std::int64_t i) const { return begin_[b * Sq_ + i]; }
  std::int64_t end(std::int64_t b, std::int64_t i) const { return end_[b * Sq_ + i]; }
  // The keys any of the queries [i0, i1) sees: [first, last), empty when first >= last.
  void span(std::int64_t b, std::int64_t i0, std::int64_t i1, std::int64_t& first, std::int64_t& last) const {
    first = std::numeric_limits<std::int64_t>::max();
    last = 0;
    for (std::int64_t i = i0; i < i1; ++i) {
      if (end(b, i) <= begin(b, i)) continue;
      first = std::min(first, begin(b, i));
      last = std::max(last, end(b, i));
    }
  }

 private:
  std::int64_t Sq_;
  std::vector<std::int64_t> begin_, end_;
};

// Rows [first, first + count) of head (b, h) of a tensor, `width` wide, in C.
template <class T, class C>
void load_rows(const T* t, const attention::RowStrides& strides, std::int64_t b, std::int64_t h, std::int64_t first,
               std::int64_t count, std::int64_t width, Block<C>& out) {
  out.resize(count, width);
  for (std::int64_t r = 0; r < count; ++r) {
    const T* row = t + strides.at(b, h, first + r);
    for (std::int64_t d = 0; d < width; ++d) out(r, d) = static_cast<C>(row[d]);
  }
}

template <class T, class C>
void store_rows(const Block<C>& in, C factor, T* t, const attention::RowStrides& strides, std::int64_t b,
                std::int64_t h, std::int64_t first) {
  for (std::int64_t r = 0; r < in.rows(); ++r) {
    T* row = t + strides.at(b, h, first + r);
    for (std::int64_t d = 0; d < in.cols(); ++d) row[d] = convert<T>(in(r, d) * factor);
  }
}

// The scores of queries [i0, i0 + Q.rows()) of head (b, h) against keys [j0, j0 + K.rows()): scale·Q·Kᵀ + bias,
// -inf where the mask hides a key.
template <class T, class C>
void block_scores(const attention::Problem& p, const KeyRanges& ranges, const T* bias, std::int64_t b, std::int64_t h,
                  std::int64_t i0, std::int64_t j0, const Block<C>& Q, const Block<C>& K, Block<C>& S) {
  S.noalias() = Q * K.transpose();
  S *= static_cast<C>(p.scale);
  const C hidden = -std::numeric_limits<C>::infinity();
  for (std::int64_t r = 0; r < S.rows(); ++r) {
    const std::int64_t i = i0 + r, begin = ranges.begin(b, i), end = ranges.end(b, i);
    const T* bias_row = p.has_bias ? bias + p.bias_at(b, h, i) : nullptr;
    for (std::int64_t c = 0; c < S.cols(); ++c) {
      const std::int64_t j = j0 + c;
      if (j < begin || j >= end) {
        S(r, c) = hidden;
      } else if (bias_row) {
        S(r, c) += static_cast<C>(bias_row[j]);
      }
    }
  }
}

// Dropout's factors Z of a block of `like`'s size: 1 / (1 - dropout) where a probability is kept, 0 elsewhere.
template <class C>
void dropout_factors(const attention::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t j0,
                     const Block<C>& like, Block<C>& Z) {
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p.dropout));
  Z.resize(like.rows(), like.cols());
  for (std::int64_t r = 0; r < Z.rows(); ++r) {
    for (std::int64_t c = 0; c < Z.cols(); ++c) Z(r, c) = p.kept(b, h, i0 + r, j0 + c) ? keep_scale : C(0);
  }
}

// The backward passes' two walks, in parallel tasks, each with its Scratch (made once per run of tasks):
//   over_key_blocks: a task per block of keys of a kv head, body(scratch, b, kvh, j0, width, queries), where
//     queries(fn) calls fn(h, i0, rows) for the group's q heads and the blocks of queries that see some of the keys,
//     in order;
//   over_query_blocks: a task per block of queries; with `bias_rows` (a broadcast bias's gradient wanted) one task
//     serves a block of the bias's rows and every (batch, head) that reads it, body(scratch, gb, gh, i0, rows,
//     heads), where heads(fn) calls fn(b, h) for them in order.
// `cost` is a task's work for parallel_for.
template <class Scratch, class Body>
void over_key_blocks(const attention::Problem& p, const KeyRanges& ranges, std::int64_t cost, Body&& body) {
  const std::int64_t group = p.q_heads / p.kv_heads;
  const std::int64_t key_blocks = (p.Sk + attention_key_block - 1) / attention_key_block;
  parallel_for(p.batch * p.kv_heads * key_blocks, cost, [&](std::int64_t first_task, std::int64_t last_task) {
    Scratch scratch;
    for (std::int64_t task = first_task; task < last_task; ++task) {
      const std::int64_t bk = task / key_blocks, b = bk / p.kv_heads, kvh = bk % p.kv_heads;
      const std::int64_t j0 = (task % key_blocks) * attention_key_block;
      const std::int64_t width = std::min(attention_key_block, p.Sk - j0);
      const auto queries = [&](auto&& fn) {
        for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (std::int64_t i0 = 0; i0 < p.Sq; i0 += attention_query_block) {
            const std::int64_t rows = std::min(attention_query_block, p.Sq - i0);
            std::int64_t first, last;
            ranges.span(b, i0, i0 + rows, first, last);
            if (first < j0 + width && last > j0) fn(h, i0, rows);  // else no query of the block sees these keys
          }
        }
      };
      body(scratch, b, kvh, j0, width, queries);
    }
  });
}

template <class Scratch, class Body>
void over_query_blocks(const attention::Problem& p, bool bias_rows, std::int64_t cost, Body&& body) {
  const std::int64_t bias_batches = bias_rows && p.bias_batch == 0 ? 1 : p.batch;
  const std::int64_t bias_heads = bias_rows && p.bias_head == 0 ? 1 : p.q_heads;
  const std::int64_t query_blocks = (p.Sq + attention_query_block - 1) / attention_query_block;
  const std::int64_t served = (p.batch / bias_batches) * (p.q_heads / bias_heads);
  parallel_for(bias_batches * bias_heads * query_blocks, served * cost,
               [&](std::int64_t first_task, std::int64_t last_task) {
    Scratch scratch;
    for (std::int64_t task = first_task; task < last_task; ++task) {
      const std::int64_t g = task / query_blocks, gb = g / bias_heads, gh = g % bias_heads;
      const std::int64_t i0 = (task % query_blocks) * attention_query_block,
                         rows = std::min(attention_query_block, p.Sq - i0);
      const auto heads = [&](auto&& fn) {
        for (std::int64_t b = gb; b < p.batch; b += bias_batches) {
          for (std::int64_t h = gh; h < p.q_heads; h += bias_heads) fn(b, h);
        }
      };
      body(scratch, gb, gh, i0, rows, heads);
    }
  });
}

// Rows [i0, i0 + dB.rows()) of the bias's gradient (gb, gh), from dB in C.
template <class T, class C>
void store_bias_rows(const Block<C>& dB, const attention::Problem& p, std::int64_t gb, std::int64_t gh,
                     std::int64_t i0, T* dbias) {
  T* out = dbias + p.bias_at(gb, gh, i0);
  for (std::int64_t r = 0; r < dB.rows(); ++r) {
    for (std::int64_t j = 0; j < p.Sk; ++j) out[r * p.Sk + j] = convert<T>(dB(r, j));
  }
}

// Each query row's δ = rowsum(dO∘O), [batch, q_heads, Sq].
template <class T>
std::vector<compute_t<T>> output_products(const attention::Problem& p, const T* o, const T* dout) {
  using C = compute_t<T>;
  std::vector<C> delta(static_cast<std::size_t>(p.batch * p.q_heads * p.Sq));
  parallel_for(p.batch * p.q_heads, 2 * p.Sq * p.Dv, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t bh = first; bh < last; ++bh) {
      const std::int64_t b = bh / p.q_heads, h = bh % p.q_heads;
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const T *o_row = o + p.o.at(b, h, i), *do_row = dout + p.o.at(b, h, i);
        C sum = 0;
        for (std::int64_t d = 0; d < p.Dv; ++d) sum += static_cast<C>(do_row[d]) * static_cast<C>(o_row[d]);
        delta[bh * p.Sq + i] = sum;
      }
    }
  });
  return delta;
}

// o (with p.o's strides) and log_sums [batch, q_heads, Sq] from q, k, v and the bias (null without one).
template <class T>
void attention_forward(const attention::Problem& p, const T* q, const T* k, const T* v, const T* bias, T* o,
                       compute_t<T>* log_sums) {
  using C = compute_t<T>;
  const KeyRanges ranges(p);
  const std::int64_t query_blocks = (p.Sq + attention_query_block - 1) / attention_query_block;
  parallel_for(p.batch * p.q_heads * query_blocks, attention_query_block * p.Sk * (p.D + p.Dv),
               [&](std::int64_t first_task, std::int64_t last_task) {
    Block<C> Q, K, V, S, Z, acc;
    Column<C> m, l;
    for (std::int64_t task = first_task; task < last_task; ++task) {
      const std::int64_t bh = task / query_blocks, b = bh / p.q_heads, h = bh % p.q_heads, kvh = p.kv_head(h);
      const std::int64_t i0 = (task % query_blocks) * attention_query_block,
                         rows = std::min(attention_query_block, p.Sq - i0);
      load_rows(q, p.q, b, h, i0, rows, p.D, Q);
      acc.setZero(rows, p.Dv);
      m.setConstant(rows, -std::numeric_limits<C>::infinity());
      l.setZero(rows);
      std::int64_t first, last;
      ranges.span(b, i0, i0 + rows, first, last);
      for (std::int64_t j0 = first; j0 < last; j0 += attention_key_block) {
        const std::int64_t width = std::min(attention_key_block, last - j0);
        load_rows(k, p.k, b, kvh, j0, width, p.D, K);
        load_rows(v, p.v, b, kvh, j0, width, p.Dv, V);
        block_scores(p, ranges, bias, b, h, i0, j0, Q, K, S);
        for (std::int64_t r = 0; r < rows; ++r) {
          const C block_max = S.row(r).maxCoeff();
          if (block_max == -std::numeric_limits<C>::infinity()) {  // no key of this block for this row
            S.row(r).setZero();
            continue;
          }
          const C new_max = std::max(m[r], block_max), rescale = std::exp(m[r] - new_max);  // 0 on a first block
          l[r] *= rescale;
          acc.row(r) *= rescale;
          for (std::int64_t c = 0; c < width; ++c) {
            S(r, c) = std::exp(S(r, c) - new_max);
            l[r] += S(r, c);
          }
          m[r] = new_max;
        }
        if (p.dropout > 0) {
          dropout_factors(p, b, h, i0, j0, S, Z);
          S.array() *= Z.array();
        }
        acc.noalias() += S * V;
      }
      for (std::int64_t r = 0; r < rows; ++r) {
        const bool sees_keys = l[r] > 0;
        acc.row(r) *= sees_keys ? C(1) / l[r] : C(0);
        log_sums[bh * p.Sq + i0 + r] = sees_keys ? m[r] + std::log(l[r]) : -std::numeric_limits<C>::infinity();
      }
      store_rows(acc, C(1), o, p.o, b, h, i0);
    }
  });
}

// What the backward passes share: the inputs, the forward's results and dO, with δ per query row.
template <class T> struct AttentionBackwardArgs {
  using C = compute_t<T>;
  const attention::Problem& p;
  const KeyRanges& ranges;
  const T *q, *k, *v, *bias, *o, *dout;
  const C* log_sums;
  std::vector<C> delta;  // output_products

  // P (dropout applied: P∘Z) and dS of queries [i0, i0 + Q.rows()) of head (b, h) against keys [j0, j0 + K.rows());
  // Z: the block's dropout factors (with dropout).
  void probabilities(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t j0, const Block<C>& Q,
                     const Block<C>& K, const Block<C>& V, const Block<C>& dO, Block<C>& P, Block<C>& dS,
                     Block<C>& Z) const {
    block_scores(p, ranges, bias, b, h, i0, j0, Q, K, P);
    const std::int64_t row0 = (b * p.q_heads + h) * p.Sq + i0;
    for (std::int64_t r = 0; r < P.rows(); ++r) {
      const C lse = log_sums[row0 + r];
      if (lse == -std::numeric_limits<C>::infinity()) {
        P.row(r).setZero();
      } else {
        P.row(r) = (P.row(r).array() - lse).exp();
      }
    }
    dS.noalias() = dO * V.transpose();  // dP, of the dropped probabilities
    if (p.dropout > 0) {
      dropout_factors(p, b, h, i0, j0, P, Z);
      dS.array() *= Z.array();
    }
    for (std::int64_t r = 0; r < P.rows(); ++r) dS.row(r) = P.row(r).array() * (dS.row(r).array() - delta[row0 + r]);
    if (p.dropout > 0) P.array() *= Z.array();
  }
};

// dq, dk, dv (with p.q's, p.k's and p.v's strides) and dbias ([Bb, Hb, Sq, Sk], or null when not wanted) from the
// forward's o and log_sums and the output's gradient dout (p.o's strides).
template <class T>
void attention_backward(const attention::Problem& p, const T* q, const T* k, const T* v, const T* bias, const T* o,
                        const compute_t<T>* log_sums, const T* dout, T* dq, T* dk, T* dv, T* dbias) {
  using C = compute_t<T>;
  const KeyRanges ranges(p);
  const AttentionBackwardArgs<T> a{p, ranges, q, k, v, bias, o, dout, log_sums, output_products(p, o, dout)};
  struct Scratch {
    Block<C> Q, K, V, dO, P, dS, Z, dK, dV, dQ, dB;
  };
  const std::int64_t group = p.q_heads / p.kv_heads;
  over_key_blocks<Scratch>(p, ranges, group * p.Sq * attention_key_block * (2 * p.D + 3 * p.Dv),
                           [&](Scratch& x, std::int64_t b, std::int64_t kvh, std::int64_t j0, std::int64_t width,
                               const auto& queries) {
    load_rows(k, p.k, b, kvh, j0, width, p.D, x.K);
    load_rows(v, p.v, b, kvh, j0, width, p.Dv, x.V);
    x.dK.setZero(width, p.D);
    x.dV.setZero(width, p.Dv);
    queries([&](std::int64_t h, std::int64_t i0, std::int64_t rows) {
      load_rows(q, p.q, b, h, i0, rows, p.D, x.Q);
      load_rows(dout, p.o, b, h, i0, rows, p.Dv, x.dO);
      a.probabilities(b, h, i0, j0, x.Q, x.K, x.V, x.dO, x.P, x.dS, x.Z);
      x.dV.noalias() += x.P.transpose() * x.dO;
      x.dK.noalias() += x.dS.transpose() * x.Q;
    });
    store_rows(x.dK, static_cast<C>(p.scale), dk, p.k, b, kvh, j0);
    store_rows(x.dV, C(1), dv, p.v, b, kvh, j0);
  });

  over_query_blocks<Scratch>(p, dbias != nullptr, attention_query_block * p.Sk * (2 * p.D + 2 * p.Dv),
                             [&](Scratch& x, std::int64_t gb, std::int64_t gh, std::int64_t i0, std::int64_t rows,
                                 const auto& heads) {
    if (dbias) x.dB.setZero(rows, p.Sk);
    heads([&](std::int64_t b, std::int64_t h) {
      load_rows(q, p.q, b, h, i0, rows, p.D, x.Q);
      load_rows(dout, p.o, b, h, i0, rows, p.Dv, x.dO);
      x.dQ.setZero(rows, p.D);
      std::int64_t first, last;
      ranges.span(b, i0, i0 + rows, first, last);
      for (std::int64_t j0 = first; j0 < last; j0 += attention_key_block) {
        const std::int64_t width = std::min(attention_key_block, last - j0);
        load_rows(k, p.k, b, p.kv_head(h), j0, width, p.D, x.K);
        load_rows(v, p.v, b, p.kv_head(h), j0, width, p.Dv, x.V);
        a.probabilities(b, h, i0, j0, x.Q, x.K, x.V, x.dO, x.P, x.dS, x.Z);
        x.dQ.noalias() += x.dS * x.K;
        if (dbias) x.dB.middleCols(j0, width) += x.dS;
      }
      store_rows(x.dQ, static_cast<C>(p.scale), dq, p.q, b, h, i0);
    });
    if (dbias) store_bias_rows(x.dB, p, gb, gh, i0, dbias);
  });
}

}  // namespace tapegrad::nn::detail
