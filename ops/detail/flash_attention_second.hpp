// dot_product_attention's second derivative on the CPU, by the FlashAttention algorithm: the backward's own backward
// (ops/attention.cpp records the backward as one node whose backward this is), with no Sq × Sk tensor.
//
// The backward (flash_attention.hpp) maps (Q, K, V, bias, dO) to dQ = c·dS·K, dK = c·dSᵀ·Q, dV = (P∘Z)ᵀ·dO and
// dbias = dS, with P = softmax(S), S = c·Q·Kᵀ + bias, dP = (dO·Vᵀ)∘Z, δ = rowsum(dO∘O) = rowsum(P∘dP) and
// dS = P∘(dP - δ). Given the cotangents gQ, gK, gV, gB of those four, L = <gQ, dQ> + <gK, dK> + <gV, dV> + <gB, dS>
// is <G, dS> + <H∘Z, P> with G = c·(gQ·Kᵀ + Q·gKᵀ) + gB and H = dO·gVᵀ, whose gradients are
//
//   γ = rowsum(G∘P)      R = P∘Z∘(G - γ)          (L through dO·Vᵀ)
//   gP = G∘(dP - δ) - γ∘dP + H∘Z,   ε = rowsum(P∘gP) = rowsum(P∘(G∘(dP - δ) + H∘Z)) - γ∘δ,   gS = P∘(gP - ε)
//   ∂Q = c·(gS·K + dS·gK)    ∂K = c·(gSᵀ·Q + dSᵀ·gQ)    ∂V = Rᵀ·dO    ∂dO = R·V + (P∘Z)·gV    ∂bias = gS
//
// in two passes as the backward's: one over blocks of queries (each row's γ and ε in a first walk over its keys,
// then ∂Q, ∂dO and ∂bias in a second), one over blocks of keys (∂K, ∂V, the group's q heads in order). Every result
// row is summed by one task in a fixed order: the same bits on every run and thread count.
#pragma once

#include "tapegrad/ops/detail/flash_attention.hpp"

namespace tapegrad::nn::detail {

// The cotangents of the backward's results: gq, gk, gv with q's, k's and v's strides, gbias [Bb, Hb, Sq, Sk] as
// the bias (null without one).
template <class T> struct AttentionCotangents {
  const T *gq, *gk, *gv, *gbias;
};

// What both passes share: the inputs, the forward's results, dO, the cotangents, and per query row δ, γ and ε.
template <class T> struct SecondOrderArgs {
  using C = compute_t<T>;
  const attention::Problem& p;
  const KeyRanges& ranges;
  const T *q, *k, *v, *bias, *o, *dout;
  const C* log_sums;
  AttentionCotangents<T> g;
  std::vector<C> delta, gamma, epsilon;  // [batch, q_heads, Sq]

  // One block's matrices, queries [i0, i0 + Q.rows()) of head (b, h) against keys [j0, j0 + K.rows()).
  struct Blocks {
    Block<C> P, Z, dP, dS, G, H;
  };

  // P, Z (with dropout), dP, dS, G and H∘Z of a block.
  void compute(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t j0, const Block<C>& Q, const Block<C>& K,
               const Block<C>& V, const Block<C>& dO, const Block<C>& gQ, const Block<C>& gK, const Block<C>& gV,
               Blocks& x) const {
    const C c = static_cast<C>(p.scale);
    block_scores(p, ranges, bias, b, h, i0, j0, Q, K, x.P);
    const std::int64_t row0 = (b * p.q_heads + h) * p.Sq + i0;
    for (std::int64_t r = 0; r < x.P.rows(); ++r) {
      const C lse = log_sums[row0 + r];
      if (lse == -std::numeric_limits<C>::infinity()) {
        x.P.row(r).setZero();
      } else {
        x.P.row(r) = (x.P.row(r).array() - lse).exp();
      }
    }
    x.dP.noalias() = dO * V.transpose();
    x.H.noalias() = dO * gV.transpose();
    if (p.dropout > 0) {
      dropout_factors(p, b, h, i0, j0, x.P, x.Z);
      x.dP.array() *= x.Z.array();
      x.H.array() *= x.Z.array();
    }
    x.dS.resize(x.P.rows(), x.P.cols());
    for (std::int64_t r = 0; r < x.P.rows(); ++r) {
      x.dS.row(r) = x.P.row(r).array() * (x.dP.row(r).array() - delta[row0 + r]);
    }
    x.G.noalias() = gQ * K.transpose();
    x.G.noalias() += Q * gK.transpose();
    x.G *= c;
    if (g.gbias) {
      for (std::int64_t r = 0; r < x.G.rows(); ++r) {
        const T* row = g.gbias + p.bias_at(b, h, i0 + r) + j0;
        for (std::int64_t col = 0; col < x.G.cols(); ++col) x.G(r, col) += static_cast<C>(row[col]);
      }
    }
  }

  // gS and R of a block whose rows' γ and ε are known; P∘Z in place of P.
  void finish(std::int64_t b, std::int64_t h, std::int64_t i0, Blocks& x, Block<C>& gS, Block<C>& R) const {
    const std::int64_t row0 = (b * p.q_heads + h) * p.Sq + i0;
    gS.resize(x.P.rows(), x.P.cols());
    R.resize(x.P.rows(), x.P.cols());
    for (std::int64_t r = 0; r < x.P.rows(); ++r) {
      const C d = delta[row0 + r], gm = gamma[row0 + r], e = epsilon[row0 + r];
      const auto P = x.P.row(r).array();
      const auto gP = x.G.row(r).array() * (x.dP.row(r).array() - d) - gm * x.dP.row(r).array() + x.H.row(r).array();
      gS.row(r) = P * (gP - e);
      R.row(r) = P * (x.G.row(r).array() - gm);
    }
    if (p.dropout > 0) {
      R.array() *= x.Z.array();
      x.P.array() *= x.Z.array();
    }
  }
};

// ∂q, ∂k, ∂v (the inputs' strides), ∂bias ([Bb, Hb, Sq, Sk], null when not wanted) and ∂dout (p.o's strides): the
// gradients of <cotangents, attention_backward(q, k, v, bias, dout)>.
template <class T>
void attention_second_order(const attention::Problem& p, const T* q, const T* k, const T* v, const T* bias,
                            const T* o, const compute_t<T>* log_sums, const T* dout, const AttentionCotangents<T>& g,
                            T* dq, T* dk, T* dv, T* dbias, T* ddout) {
  using C = compute_t<T>;
  using Args = SecondOrderArgs<T>;
  const KeyRanges ranges(p);
  const std::size_t rows_total = static_cast<std::size_t>(p.batch * p.q_heads * p.Sq);
  Args a{p, ranges, q, k, v, bias, o, dout, log_sums, g, output_products(p, o, dout), std::vector<C>(rows_total),
         std::vector<C>(rows_total)};
  const C c = static_cast<C>(p.scale);
  struct Scratch {
    Block<C> Q, gQ, K, gK, V, gV, dO, dQ, ddO, dK, dV, gS, R, dB;
    typename Args::Blocks x;
  };

  // γ and ε in a first walk over a row block's keys, then ∂Q, ∂dO and ∂bias.
  over_query_blocks<Scratch>(p, dbias != nullptr, attention_query_block * p.Sk * (6 * p.D + 6 * p.Dv),
                             [&](Scratch& s, std::int64_t gb, std::int64_t gh, std::int64_t i0, std::int64_t rows,
                                 const auto& heads) {
    if (dbias) s.dB.setZero(rows, p.Sk);
    heads([&](std::int64_t b, std::int64_t h) {
      load_rows(q, p.q, b, h, i0, rows, p.D, s.Q);
      load_rows(g.gq, p.q, b, h, i0, rows, p.D, s.gQ);
      load_rows(dout, p.o, b, h, i0, rows, p.Dv, s.dO);
      std::int64_t first, last;
      ranges.span(b, i0, i0 + rows, first, last);
      const std::int64_t row0 = (b * p.q_heads + h) * p.Sq + i0;
      const auto keys = [&](std::int64_t j0, std::int64_t width) {
        load_rows(k, p.k, b, p.kv_head(h), j0, width, p.D, s.K);
        load_rows(g.gk, p.k, b, p.kv_head(h), j0, width, p.D, s.gK);
        load_rows(v, p.v, b, p.kv_head(h), j0, width, p.Dv, s.V);
        load_rows(g.gv, p.v, b, p.kv_head(h), j0, width, p.Dv, s.gV);
        a.compute(b, h, i0, j0, s.Q, s.K, s.V, s.dO, s.gQ, s.gK, s.gV, s.x);
      };
      for (std::int64_t r = 0; r < rows; ++r) a.gamma[row0 + r] = a.epsilon[row0 + r] = 0;
      for (std::int64_t j0 = first; j0 < last; j0 += attention_key_block) {
        keys(j0, std::min(attention_key_block, last - j0));
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto P = s.x.P.row(r).array();
          a.gamma[row0 + r] += (s.x.G.row(r).array() * P).sum();
          a.epsilon[row0 + r] +=
              (P * (s.x.G.row(r).array() * (s.x.dP.row(r).array() - a.delta[row0 + r]) + s.x.H.row(r).array())).sum();
        }
      }
      for (std::int64_t r = 0; r < rows; ++r) a.epsilon[row0 + r] -= a.gamma[row0 + r] * a.delta[row0 + r];
      s.dQ.setZero(rows, p.D);
      s.ddO.setZero(rows, p.Dv);
      for (std::int64_t j0 = first; j0 < last; j0 += attention_key_block) {
        const std::int64_t width = std::min(attention_key_block, last - j0);
        keys(j0, width);
        a.finish(b, h, i0, s.x, s.gS, s.R);
        s.dQ.noalias() += s.gS * s.K;
        s.dQ.noalias() += s.x.dS * s.gK;
        s.ddO.noalias() += s.R * s.V;
        s.ddO.noalias() += s.x.P * s.gV;
        if (dbias) s.dB.middleCols(j0, width) += s.gS;
      }
      store_rows(s.dQ, c, dq, p.q, b, h, i0);
      store_rows(s.ddO, C(1), ddout, p.o, b, h, i0);
    });
    if (dbias) store_bias_rows(s.dB, p, gb, gh, i0, dbias);
  });

  // ∂K and ∂V, once every row's γ and ε are known.
  const std::int64_t group = p.q_heads / p.kv_heads;
  over_key_blocks<Scratch>(p, ranges, group * p.Sq * attention_key_block * (6 * p.D + 6 * p.Dv),
                           [&](Scratch& s, std::int64_t b, std::int64_t kvh, std::int64_t j0, std::int64_t width,
                               const auto& queries) {
    load_rows(k, p.k, b, kvh, j0, width, p.D, s.K);
    load_rows(g.gk, p.k, b, kvh, j0, width, p.D, s.gK);
    load_rows(v, p.v, b, kvh, j0, width, p.Dv, s.V);
    load_rows(g.gv, p.v, b, kvh, j0, width, p.Dv, s.gV);
    s.dK.setZero(width, p.D);
    s.dV.setZero(width, p.Dv);
    queries([&](std::int64_t h, std::int64_t i0, std::int64_t rows) {
      load_rows(q, p.q, b, h, i0, rows, p.D, s.Q);
      load_rows(g.gq, p.q, b, h, i0, rows, p.D, s.gQ);
      load_rows(dout, p.o, b, h, i0, rows, p.Dv, s.dO);
      a.compute(b, h, i0, j0, s.Q, s.K, s.V, s.dO, s.gQ, s.gK, s.gV, s.x);
      a.finish(b, h, i0, s.x, s.gS, s.R);
      s.dK.noalias() += s.gS.transpose() * s.Q;
      s.dK.noalias() += s.x.dS.transpose() * s.gQ;
      s.dV.noalias() += s.R.transpose() * s.dO;
    });
    store_rows(s.dK, c, dk, p.k, b, kvh, j0);
    store_rows(s.dV, C(1), dv, p.v, b, kvh, j0);
  });
}

}  // namespace tapegrad::nn::detail
