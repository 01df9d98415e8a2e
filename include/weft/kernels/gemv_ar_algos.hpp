// The fused GEMV + all-reduce after the GEMV (ops::GemvAllReduce's `fused` method), as
// __host__ __device__ templates: the CUDA kernel (src/kernels/gemv_ar_kernels.cu) and the host
// backend's teams (src/ops/gemv_ar/host_fused.cpp) run the same exchange, sum and epilogue.
//
// Parts: y's n columns are cut into parts of `pw` columns (pw a multiple of 8; the last part
// may be narrower); CTA (team) k of `ctas` owns parts k, k + ctas, k + 2 ctas, ... on every
// rank, so the CTA that pushes a part's lines on one rank is the CTA that reads them on every
// other (same index, same epoch). pw and ctas must be the same on every rank.
//
// One call of CTA k, epoch e = its completed calls + 1 (a uint64 per CTA, never reset):
//  1. for each part: the local GEMV of the part's columns for all m tokens (the caller's code),
//     then push_part: every value rounded to the dtype, 4 per 16-byte LL line (8 data bytes,
//     the epoch e twice: collective_algos.hpp's format) into receive block
//     [parity e & 1][source = this rank] of every rank, this one included;
//  2. finish: for each of its parts' lines, wait for every source's line (deadline
//     c.timeout_ns, the error naming the peer and the op), sum the sources in rank order in
//     fp32 (every rank sums the same rounded values in the same order: bitwise the same y),
//     write y -- or, with the epilogue, residual_out = round(round(sum) + residual), then the
//     norm (below) and y = round(residual_out * inv_rms[t] * gamma);
//  3. the epoch is advanced.
//
// Invariant of the receive lines (why two parities suffice): CTA k of rank r writes call e's
// lines of its parts into rank p's block [e & 1][r] and next writes there in call e + 2. Before
// that, its call e + 1 waited for p's call-(e + 1) lines of the same parts, which p's CTA k
// pushed only after its call e had summed (read) r's call-e lines. A line whose flags are not
// the reader's epoch is stale (e - 2 or older) and is waited on, never read.
//
// The epilogue's norm needs every column of a token, which other CTAs own: each CTA writes its
// per-token sum of squares of residual_out over its parts to sums[q][t][k], arrives at a
// grid-wide barrier (a counter in the heap, +1 per CTA per epilogue call, never reset), waits
// until it reads >= en * ctas, then sums sums[q][t][0 .. ctas) in a fixed order (bitwise the
// same on every rank, unlike fp32 atomics). en, the epilogue call's number, is read from the
// counter itself before the CTA arrives: all CTAs of call en - 1 arrived before this one passed
// that barrier, and none of call en + 1 can arrive before this one does, so the counter lies in
// [(en - 1) ctas, en ctas). The sums are double-buffered by q = en & 1: CTA k writes sums[q]
// again in call en + 2, after barrier en + 1, which every CTA reaches only after it finished
// reading sums[q] in call en. Nothing is zeroed. The barrier needs every CTA resident at once
// (the GPU grid is persistent; host teams are threads).
//
// Norm state layout at a.norm_off (kernels::gemv_norm_bytes(m_max, ctas)): the counter (8
// bytes, 16 reserved), then sums [2][m_max][ctas] floats.
#pragma once
#include <cmath>

#include "weft/device/api.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/collective_algos.hpp"
#include "weft/kernels/gemv_ar_kernels.hpp"

namespace weft::gemv {

using kernels::GemvArgs;

// Lines each thread polls per batch in finish (all issued before any is waited on).
inline constexpr int kLineUnroll = 4;
// The norm's per-CTA sums each thread loads per batch (in flight together), and at most this
// many threads per token (each round of the tree over them is a group-wide sync).
inline constexpr int kNormUnroll = 8;
inline constexpr int kNormGroup = 64;

WEFT_HD int parts_of(int n, int pw) { return (n + pw - 1) / pw; }
// Parts CTA k owns: k, k + ctas, ...
WEFT_HD int parts_of_cta(int n, int pw, int ctas, int k) {
  const int np = parts_of(n, pw);
  return np > k ? (np - k + ctas - 1) / ctas : 0;
}
WEFT_HD int max_parts_per_cta(int n, int pw, int ctas) { return parts_of_cta(n, pw, ctas, 0); }

// Floats of the per-CTA scratch finish() needs (shared memory on the GPU): each line's sum of
// squares [parts per CTA * m_max * pw / 4], per-part sums of squares [m_max][parts per CTA],
// group sums [max(threads, m_max)], inv_rms [m_max].
WEFT_HD int scratch_floats(int m_max, int parts_per_cta, int pw, int threads) {
  return parts_per_cta * m_max * (pw / 4) + m_max * parts_per_cta + (threads > m_max ? threads : m_max) + m_max;
}

// Heap offset of the line holding columns j .. j+3 of token t from `src`, parity par.
WEFT_HD uint64_t line_off(const GemvArgs& a, int world, uint64_t par, int src, int t, int j) {
  const uint64_t per_src = static_cast<uint64_t>(a.m_max) * static_cast<uint64_t>(a.n) / 4;
  return a.lines_off +
         16ull * ((par * static_cast<uint64_t>(world) + static_cast<uint64_t>(src)) * per_src +
                  static_cast<uint64_t>(t) * static_cast<uint64_t>(a.n / 4) + static_cast<uint64_t>(j / 4));
}
// Part flags (a.part_flags): block [par][src]'s values (8 bytes: columns j .. j+3 of token t)
// and the flag of its part `part`.
WEFT_HD uint64_t block_off(const GemvArgs& a, int world, uint64_t par, int src) {
  return a.flags_off + kernels::gemv_flag_block_bytes(a.m_max, a.n) *
                           (par * static_cast<uint64_t>(world) + static_cast<uint64_t>(src));
}
WEFT_HD uint64_t value_off(const GemvArgs& a, int world, uint64_t par, int src, int t, int j) {
  return block_off(a, world, par, src) +
         2ull * (static_cast<uint64_t>(t) * static_cast<uint64_t>(a.n) + static_cast<uint64_t>(j));
}
WEFT_HD uint64_t part_flag_off(const GemvArgs& a, int world, uint64_t par, int src, int part) {
  return block_off(a, world, par, src) + 2ull * static_cast<uint64_t>(a.m_max) * static_cast<uint64_t>(a.n) +
         8ull * static_cast<uint64_t>(part);
}
WEFT_HD uint64_t norm_sums_off(const GemvArgs& a, uint64_t par, int t, int k) {
  return a.norm_off + 16 +
         4ull * ((par * static_cast<uint64_t>(a.m_max) + static_cast<uint64_t>(t)) * static_cast<uint64_t>(a.ctas) +
                 static_cast<uint64_t>(k));
}

WEFT_HD uint64_t epoch_begin(const dev::DeviceCtx& c, const GemvArgs& a, int k) {
  return *c.local<uint64_t>(a.epoch_off + 8ull * static_cast<uint64_t>(k)) + 1;
}
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void epoch_end(Coop g, const dev::DeviceCtx& c, const GemvArgs& a, int k, uint64_t e) {
  g.sync();  // every thread has read the epoch before the leader advances it
  if (g.rank() == 0) *c.local<uint64_t>(a.epoch_off + 8ull * static_cast<uint64_t>(k)) = e;
}

// Packs 4 values rounded to T into a line's 8 data bytes (element q at bits 16 q).
template <class T>
WEFT_HD uint64_t pack4(const float* v) {
  T r[4];
  for (int q = 0; q < 4; ++q) r[q] = dev::from_float<T>(v[q]);
  uint64_t d;
  __builtin_memcpy(&d, r, 8);
  return d;
}
template <class T>
WEFT_HD void unpack4(uint64_t d, float* v) {
  T r[4];
  __builtin_memcpy(r, &d, 8);
  for (int q = 0; q < 4; ++q) v[q] = dev::to_float(r[q]);
}

// Pushes this rank's partial of part `part`, columns [j0, j1) (multiples of 4; j1 - j0 <= the
// part width), for tokens 0 .. m-1 into block [e & 1][rank] of every rank, this one first.
// value(t, j, v) gives the fp32 partial of columns j .. j+3 of token t in v[0..3]. With part
// flags: the values, a group sync, then the part's flag (= e) on every rank, released by the
// group's first thread (cumulative: the group's stores, ordered by the sync, come first).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop, class Value>
WEFT_HD void push_part(Coop g, const dev::DeviceCtx& c, const GemvArgs& a, uint64_t e, int part, int j0, int j1,
                       const Value& value) {
  const int lpt = (j1 - j0) / 4;  // lines per token
  const int items = a.m * lpt;
  const uint64_t par = e & 1;
  const uint32_t flag = static_cast<uint32_t>(e);
  for (int i = g.rank(); i < items; i += g.size()) {
    const int t = i / lpt, j = j0 + 4 * (i % lpt);
    float v[4];
    value(t, j, v);
    const uint64_t d = pack4<T>(v);
    if (a.part_flags) {
      const uint64_t off = value_off(a, c.world, par, c.rank, t, j);
      for (int dd = 0; dd < c.world; ++dd) dev::store_relaxed(c.ptr<uint64_t>((c.rank + dd) % c.world, off), d);
    } else {
      const uint64_t off = line_off(a, c.world, par, c.rank, t, j);
      for (int dd = 0; dd < c.world; ++dd) coll::ll_store(c.ptr<uint64_t>((c.rank + dd) % c.world, off), d, flag);
    }
  }
  if (!a.part_flags) return;
  g.sync();
  if (g.rank() == 0) {
    const uint64_t off = part_flag_off(a, c.world, par, c.rank, part);
    for (int dd = 0; dd < c.world; ++dd) dev::store_release(c.ptr<uint64_t>((c.rank + dd) % c.world, off), e);
  }
}

// Item i of CTA k's lines: its part's columns j .. j+3 of token t (false past the end).
WEFT_HD bool item_at(const GemvArgs& a, int pw, int k, int items, int i, int& t, int& j) {
  if (i >= items) return false;
  const int lpp = pw / 4, per_part = a.m * lpp;
  const int part = k + (i / per_part) * a.ctas;
  t = (i % per_part) / lpp;
  j = part * pw + 4 * (i % lpp);
  return j < a.n;
}

// Step 2 (after every part of CTA k was pushed): waits for, sums and writes CTA k's lines, then
// the epilogue when a.residual is set. `scratch`: scratch_floats(m_max, parts, pw, g.size()) floats
// shared by the group.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, bool kPrint = true, class Coop>
WEFT_HD void finish(Coop g, const dev::DeviceCtx& c, const GemvArgs& a, int k, int pw, uint64_t e, float* scratch) {
  constexpr int U = kLineUnroll;
  const uint64_t par = e & 1;
  const uint32_t flag = static_cast<uint32_t>(e);
  const int P = parts_of_cta(a.n, pw, a.ctas, k);
  const int items = P * a.m * (pw / 4);
  const int me = g.rank(), step = g.size();
  const bool epi = a.residual != nullptr;
  T* y = static_cast<T*>(a.y);
  float* line_sq = scratch;  // [items]: each line's sum of squares of residual_out (epilogue)
  if (a.part_flags) {
    // One thread per (part, source) waits for that flag (acquire); the sync orders every
    // thread's loads of the values after those waits.
    for (int w = me; w < P * c.world; w += step) {
      const int part = k + (w / c.world) * a.ctas, p = w % c.world;
      dev::wait_ge<kPrint>(c, part_flag_off(a, c.world, par, p, part), e, p, dev::WaitKind::kSignal, a.op_tag);
    }
    g.sync();
  }
  for (int i0 = me; i0 < items; i0 += U * step) {
    int t[U], j[U];
    bool live[U];
    float acc[U][4];
    for (int u = 0; u < U; ++u) {
      live[u] = item_at(a, pw, k, items, i0 + u * step, t[u], j[u]);
      for (int q = 0; q < 4; ++q) acc[u][q] = 0.f;
    }
    for (int p = 0; p < c.world; ++p) {  // rank order: every rank gets bitwise the same sums
      uint64_t v[U];
      bool ok[U];
      for (int u = 0; u < U; ++u) {
        if (a.part_flags) {
          ok[u] = true;
          v[u] = live[u] ? dev::load_relaxed(c.local<const uint64_t>(value_off(a, c.world, par, p, t[u], j[u]))) : 0;
          continue;
        }
        ok[u] = !live[u] || coll::ll_try(c.local<const uint64_t>(line_off(a, c.world, par, p, t[u], j[u])), flag, v[u]);
      }
      for (int u = 0; u < U; ++u)
        if (!ok[u]) {
          const uint64_t off = line_off(a, c.world, par, p, t[u], j[u]);
          v[u] = coll::ll_wait<kPrint>(c, c.local<const uint64_t>(off), flag, p, off, a.op_tag);
        }
      for (int u = 0; u < U; ++u) {
        if (!live[u]) continue;
        float f[4];
        unpack4<T>(v[u], f);
        for (int q = 0; q < 4; ++q) acc[u][q] += f[q];
      }
    }
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * step;
      if (!live[u]) {
        if (epi && i < items) line_sq[i] = 0.f;  // a line past n (the last part's)
        continue;
      }
      const uint64_t at = static_cast<uint64_t>(t[u]) * static_cast<uint64_t>(a.n) + static_cast<uint64_t>(j[u]);
      if (!epi) {
        *reinterpret_cast<uint64_t*>(y + at) = pack4<T>(acc[u]);
        continue;
      }
      float s[4], r[4];
      unpack4<T>(pack4<T>(acc[u]), s);  // y rounded to the dtype, as the unfused sequence has it
      unpack4<T>(*reinterpret_cast<const uint64_t*>(static_cast<const T*>(a.residual) + at), r);
      for (int q = 0; q < 4; ++q) s[q] += r[q];
      const uint64_t ro = pack4<T>(s);
      *reinterpret_cast<uint64_t*>(static_cast<T*>(a.residual_out) + at) = ro;
      unpack4<T>(ro, s);  // the rounded values, as the norm reads them
      line_sq[i] = s[0] * s[0] + s[1] * s[1] + s[2] * s[2] + s[3] * s[3];
    }
  }
  if (!epi) return;

  // ---- epilogue: per-token sums of squares, grid barrier, normalisation ----
  const int lpp = pw / 4, per_part = a.m * lpp;
  float* part_sq = scratch + P * a.m_max * lpp;                   // [m][P]
  float* group_sq = part_sq + a.m_max * P;                        // [m * G]
  float* inv_rms = group_sq + (step > a.m_max ? step : a.m_max);  // [m]
  const T* ro = static_cast<const T*>(a.residual_out);
  g.sync();                                   // this CTA's line sums are written
  for (int i = me; i < a.m * P; i += step) {  // a part's lines in order
    const int t = i / P, pi = i % P;
    const float* ls = line_sq + pi * per_part + t * lpp;
    float s = 0.f;
    for (int l = 0; l < lpp; ++l) s += ls[l];
    part_sq[i] = s;
  }
  uint64_t* counter = c.local<uint64_t>(a.norm_off);
  const uint64_t ctas = static_cast<uint64_t>(a.ctas);
  const uint64_t en = dev::load_acquire(counter) / ctas + 1;  // see the header comment
  const uint64_t q = en & 1;
  g.sync();
  for (int t = me; t < a.m; t += step) {
    float s = 0.f;
    for (int pi = 0; pi < P; ++pi) s += part_sq[t * P + pi];
    *c.local<float>(norm_sums_off(a, q, t, k)) = s;
  }
  g.sync();
  if (me == 0) {
    dev::add_release_gpu(counter, 1);  // cumulative: the group's sums (ordered by the sync) come first
    dev::wait_ge<kPrint>(c, a.norm_off, en * ctas, -1, dev::WaitKind::kBarrier, a.op_tag);
  }
  g.sync();
  // Token t's total over the CTAs: G threads (the largest power of two <= kNormGroup with m G
  // <= the group's size) each sum the CTAs G apart, then a pairwise tree over the G group sums;
  // the order depends only on (ctas, m, group size): the same on every rank.
  int G = 1;
  while (2 * G * a.m <= step && 2 * G <= kNormGroup) G *= 2;
  for (int i = me; i < a.m * G; i += step) {
    const int t = i / G, gi = i % G;
    float s = 0.f;
    int kk = gi;
    for (; kk + (kNormUnroll - 1) * G < a.ctas; kk += kNormUnroll * G) {
      float v[kNormUnroll];
      for (int u = 0; u < kNormUnroll; ++u) v[u] = *c.local<const float>(norm_sums_off(a, q, t, kk + u * G));
      for (int u = 0; u < kNormUnroll; ++u) s += v[u];  // the order of the plain loop below
    }
    for (; kk < a.ctas; kk += G) s += *c.local<const float>(norm_sums_off(a, q, t, kk));
    group_sq[i] = s;
  }
  g.sync();
  for (int half = G / 2; half >= 1; half /= 2) {
    for (int i = me; i < a.m * half; i += step) {
      const int t = i / half, gi = i % half;
      group_sq[t * G + gi] += group_sq[t * G + gi + half];
    }
    g.sync();
  }
  for (int t = me; t < a.m; t += step) {
    // 1 / sqrt (IEEE in CUDA without fast math, as on the host): GPU and host agree bitwise.
    inv_rms[t] = 1.0f / sqrtf(group_sq[t * G] / static_cast<float>(a.n) + a.eps);
  }
  g.sync();
  const T* gamma = static_cast<const T*>(a.gamma);
  for (int i = me; i < items; i += step) {
    int t, j;
    if (!item_at(a, pw, k, items, i, t, j)) continue;
    const uint64_t at = static_cast<uint64_t>(t) * static_cast<uint64_t>(a.n) + static_cast<uint64_t>(j);
    float r[4], gm[4];
    unpack4<T>(*reinterpret_cast<const uint64_t*>(ro + at), r);
    unpack4<T>(*reinterpret_cast<const uint64_t*>(gamma + j), gm);
    for (int qq = 0; qq < 4; ++qq) r[qq] = r[qq] * inv_rms[t] * gm[qq];
    *reinterpret_cast<uint64_t*>(y + at) = pack4<T>(r);
  }
}

}  // namespace weft::gemv
