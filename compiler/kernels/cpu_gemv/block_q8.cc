// x [N, K] f32 times a weight of int8 codes [O, K] with one scale (and optionally one offset) per block of B
// codes along K: y[n, o] = sum_b scale[o, b] * (x[n, b] . codes[o, b]) - offset[o, b] * sum(x[n, b]).
// A GGUF K-quant or Q8_0 / Q5_0 weight is exactly this form (compiler/kernels/cpu_gemv/layout.py), so the
// weight is read at ~1.1-1.25 bytes per element where the exact path reads fp32. Codes 0..15 (Q4_K's) may come
// two per byte (uint8 [O, K / 2]; byte j of a block of 32 holds code j in its low and code j + 16 in its high
// nibble): 0.75 bytes per element with the block's scale and offset, unpacked in registers to the same int16
// codes, so the nibble form computes exactly the int8 form's numbers. The activations are quantized
// to int16 per 32 elements (the only rounding the kernel adds), so each block's dot is integer arithmetic.
//
// Each output (n, o) is computed by the same instruction sequence whatever N is, however many weight rows are
// register-blocked together and however the outputs are split across threads: the result is batch-invariant
// (deterministic mode relies on it).
//
// Why this shape (measured on an AVX2 Zen 1 core, docs/cpu_target.md): a block's 32 products come out of two
// int16 madds as 8 int32 lanes; the lanes of 8 blocks are summed by a horizontal-add tree (in-lane, no
// cross-lane permutes: those cost 8 micro-ops each on Zen 1), so the int->float convert, the scale multiply
// and the FMA run once per 4 blocks instead of once per block. Four weight rows share each activation load,
// and their accumulators are four independent FMA chains; two activation rows share each widening of the codes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#if !(defined(__AVX2__) && defined(__FMA__))
#error "block_q8.cc needs AVX2 and FMA (native.py builds it with -march=native; where the build fails, the jnp form runs)"
#endif
#include <immintrin.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kChunk = 32;  // activation elements per int16 scale
constexpr int kGroup = 8;   // weight blocks reduced together by the horizontal-add tree
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 4
#endif

// The activations of one call, quantized once: per 32 elements int16 codes (scale max|x| / 32767, round to
// nearest: 2^-16 of the chunk's largest value), and per WEIGHT block its activation scale and float sum
// (offsets only), padded to whole groups of 8 blocks with zeros so the tail group reads no other row's values.
struct Activations {
  std::vector<int16_t> q;      // [N, K]
  std::vector<float> scale;    // [N, blocks_padded]: the activation scale of each weight block
  std::vector<float> sum;      // [N, blocks_padded]: each weight block's sum of x (offsets only)
  int64_t blocks_padded = 0;
};

Activations quantize(const float* x, int64_t n, int64_t k, int64_t block, bool sums) {
  const int64_t nb = k / block, padded = (nb + kGroup - 1) / kGroup * kGroup, per_chunk = kChunk / block;
  Activations a{std::vector<int16_t>(n * k), std::vector<float>(n * padded, 0.f), {}, padded};
  if (sums) a.sum.assign(n * padded, 0.f);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k / kChunk; ++c) {
      const float* v = x + r * k + c * kChunk;
      float amax = 0.f;
      for (int j = 0; j < kChunk; ++j) amax = std::max(amax, std::abs(v[j]));
      const float scale = amax / 32767.f, inv = amax > 0.f ? 32767.f / amax : 0.f;
      for (int j = 0; j < kChunk; ++j) a.q[r * k + c * kChunk + j] = static_cast<int16_t>(std::nearbyint(v[j] * inv));
      for (int64_t h = 0; h < per_chunk; ++h) a.scale[r * padded + c * per_chunk + h] = scale;
    }
    if (sums)
      for (int64_t b = 0; b < nb; ++b) {
        float total = 0.f;
        for (int64_t j = 0; j < block; ++j) total += x[r * k + b * block + j];
        a.sum[r * padded + b] = total;
      }
  }
  return a;
}

struct Problem {
  const uint8_t* codes;  // [O, K] int8 codes, or [O, K / 2] nibble pairs (rows `row_bytes` apart)
  const float* scale;   // [O, nb]
  const float* offset;  // [O, nb] or null
  float* y;             // [N, O]
  int64_t n, k, o, block, row_bytes;
};

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256i widen16(const uint8_t* codes) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
}

// 16 bytes of nibble pairs -> the block's 32 codes as int16: c0 codes 0..15 (low nibbles), c1 16..31 (high)
inline void unpack_nibbles(const uint8_t* bytes, __m256i& c0, __m256i& c1) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)), low4 = _mm_set1_epi8(0x0F);
  c0 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
  c1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
}

inline __m256i load16(const int16_t* x) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)); }

// Up to 4 consecutive floats broadcast to both 128-bit halves ([v0..v3, v0..v3]), zeros past `count`.
inline __m256 broadcast4(const float* v, int64_t count) {
  if (count >= 4) return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(v));
  alignas(16) float tmp[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t i = 0; i < count; ++i) tmp[i] = v[i];
  return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(tmp));
}

inline __m256 load8(const float* v, int64_t count) {
  if (count >= 8) return _mm256_loadu_ps(v);
  alignas(32) float tmp[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t i = 0; i < count; ++i) tmp[i] = v[i];
  return _mm256_load_ps(tmp);
}

// The 8 int32 lane vectors of blocks g..g+7 of one weight row against RN activation rows (zeros past `count`
// blocks); each block's codes are widened to int16 once for the RN rows. Block 32: two madds per block and row.
// Block 16: each madd is one block. NIBBLES: the codes come two per byte (block 32 only).
template <int BLOCK, bool FULL, int RN, bool NIBBLES>
inline void block_vectors(const uint8_t* c, const int16_t* const x[RN], int count, __m256i v[RN][kGroup]) {
  static_assert(!NIBBLES || BLOCK == 32, "nibble pairs come in blocks of 32");
  for (int j = 0; j < kGroup; ++j) {
    if (!FULL && j >= count) {
      for (int n = 0; n < RN; ++n) v[n][j] = _mm256_setzero_si256();
    } else if constexpr (BLOCK == 32) {
      __m256i c0, c1;
      if constexpr (NIBBLES) {
        unpack_nibbles(c + 16 * j, c0, c1);
      } else {
        c0 = widen16(c + 32 * j);
        c1 = widen16(c + 32 * j + 16);
      }
      for (int n = 0; n < RN; ++n)
        v[n][j] = _mm256_add_epi32(_mm256_madd_epi16(c0, load16(x[n] + 32 * j)),
                                   _mm256_madd_epi16(c1, load16(x[n] + 32 * j + 16)));
    } else {
      const __m256i c0 = widen16(c + 16 * j);
      for (int n = 0; n < RN; ++n) v[n][j] = _mm256_madd_epi16(c0, load16(x[n] + 16 * j));
    }
  }
}

// The horizontal-add tree: lanes of h0123 are [b0, b1, b2, b3 | b0, b1, b2, b3] (each block's low | high
// 128-bit half summed), h4567 the same for b4..b7. Exact (|sum| <= 32 * 128 * 32767 < 2^31).
inline void reduce_group(const __m256i v[kGroup], __m256i& h0123, __m256i& h4567) {
  h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
}

// sum over blocks of offset[row, b] * sum(x[n, b]) (the K-quants' minimums): 8 blocks per FMA, in group order
inline float offset_term(const Problem& p, const Activations& a, int64_t row, int64_t n) {
  const int64_t nb = p.k / p.block;
  const float* xsum = a.sum.data() + n * a.blocks_padded;
  __m256 off = _mm256_setzero_ps();
  for (int64_t g = 0; g < nb; g += kGroup)
    off = _mm256_fmadd_ps(load8(p.offset + row * nb + g, nb - g), _mm256_loadu_ps(xsum + g), off);
  return hsum(off);
}

// RO weight rows (o0..o0+RO-1) against RN activation rows (n0..n0+RN-1): y[n, o]. Every (n, o) runs the same
// arithmetic for any RO, RN, N or thread split: the groups in order, a fixed tree within each (integer sums
// exact, the float operations per output the same sequence).
template <int BLOCK, bool NIBBLES, int RO, int RN>
void rows_x_activations(const Problem& p, const Activations& a, int64_t o0, int64_t n0) {
  const int64_t nb = p.k / BLOCK;
  const int16_t* x[RN];
  const float* xs[RN];
  for (int n = 0; n < RN; ++n) {
    x[n] = a.q.data() + (n0 + n) * p.k;
    xs[n] = a.scale.data() + (n0 + n) * a.blocks_padded;
  }
  __m256 acc[RO][RN];
  for (int r = 0; r < RO; ++r)
    for (int n = 0; n < RN; ++n) acc[r][n] = _mm256_setzero_ps();
  for (int64_t g = 0; g < nb; g += kGroup) {
    const int count = static_cast<int>(std::min<int64_t>(kGroup, nb - g));
    const int16_t* xg[RN];
    for (int n = 0; n < RN; ++n) xg[n] = x[n] + g * BLOCK;
    for (int r = 0; r < RO; ++r) {
      const int64_t row = o0 + r;
      __m256i v[RN][kGroup];
      constexpr int kGroupBytes = kGroup * BLOCK / (NIBBLES ? 2 : 1);
      const uint8_t* c = p.codes + row * p.row_bytes + g / kGroup * kGroupBytes;
      // the rows PREFETCH_ROWS ahead at this position: a row is a short stream (1.5 KB at K = 1536) that the
      // hardware prefetcher barely ramps up on, and the weights are read once per call (from memory)
      const char* ahead = reinterpret_cast<const char*>(c + PREFETCH_ROWS * p.row_bytes);
      for (int line = 0; line < kGroupBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p.scale + (row + PREFETCH_ROWS) * nb + g), _MM_HINT_T0);
      if (p.offset) _mm_prefetch(reinterpret_cast<const char*>(p.offset + (row + PREFETCH_ROWS) * nb + g), _MM_HINT_T0);
      if (count == kGroup)
        block_vectors<BLOCK, true, RN, NIBBLES>(c, xg, count, v);
      else
        block_vectors<BLOCK, false, RN, NIBBLES>(c, xg, count, v);
      const float* ws = p.scale + row * nb + g;
      const __m256 w0 = broadcast4(ws, count), w1 = broadcast4(ws + 4, count - 4);
      for (int n = 0; n < RN; ++n) {
        __m256i h0123, h4567;
        reduce_group(v[n], h0123, h4567);
        // activation scales of blocks g..g+7 in the tree's lane order (padded with zeros: always in bounds)
        const __m256 s0 = _mm256_mul_ps(w0, _mm256_broadcast_ps(reinterpret_cast<const __m128*>(xs[n] + g)));
        const __m256 s1 = _mm256_mul_ps(w1, _mm256_broadcast_ps(reinterpret_cast<const __m128*>(xs[n] + g + 4)));
        acc[r][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h0123), s0, acc[r][n]);
        acc[r][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h4567), s1, acc[r][n]);
      }
    }
  }
  for (int r = 0; r < RO; ++r)
    for (int n = 0; n < RN; ++n) {
      float total = hsum(acc[r][n]);
      if (p.offset) total -= offset_term(p, a, o0 + r, n0 + n);
      p.y[(n0 + n) * p.o + o0 + r] = total;
    }
}

#include "block_q8_vnni.h"

#ifdef EMBER_VNNI
using Planes = BytePlanes;
#else
struct Planes {};
#endif

// weight rows per pass (one activation load for all) and activation rows per pass (one code widening for all):
// 4 x 2 measured 9-16% faster than 4 x 1 at 5 rows, the same at 1 (docs/cpu_target.md)
constexpr int kRowBlock = 4;
constexpr int kActBlock = 2;

template <int BLOCK, bool NIBBLES, int RO, int RN>
void rows_block(const Problem& p, const Activations& a, const Planes& b, int64_t o, int64_t n) {
#ifdef EMBER_VNNI
  vnni_rows_x_activations<BLOCK, NIBBLES, RO, RN>(p, a, b, o, n);
#else
  rows_x_activations<BLOCK, NIBBLES, RO, RN>(p, a, o, n);
#endif
}

template <int BLOCK, bool NIBBLES, int RO>
void activation_rows(const Problem& p, const Activations& a, const Planes& b, int64_t o) {
  int64_t n = 0;
  for (; n + kActBlock <= p.n; n += kActBlock) rows_block<BLOCK, NIBBLES, RO, kActBlock>(p, a, b, o, n);
  for (; n < p.n; ++n) rows_block<BLOCK, NIBBLES, RO, 1>(p, a, b, o, n);
}

template <int BLOCK, bool NIBBLES>
void weight_rows(const Problem& p, const Activations& a, const Planes& b, int64_t first, int64_t last) {
  int64_t o = first;
#ifdef EMBER_VNNI
  if (one_row_at_a_time(p)) {
    for (; o < last; ++o) activation_rows<BLOCK, NIBBLES, 1>(p, a, b, o);
    return;
  }
#endif
  for (; o + kRowBlock <= last; o += kRowBlock) activation_rows<BLOCK, NIBBLES, kRowBlock>(p, a, b, o);
  for (; o < last; ++o) activation_rows<BLOCK, NIBBLES, 1>(p, a, b, o);
}

// codes_per_byte 1: int8 codes [O, K]; 2: nibble pairs [O, K / 2] (blocks of 32)
ffi::Error Run(ffi::ThreadPool& pool, ffi::Buffer<ffi::F32>& x, const uint8_t* codes, int64_t code_rows,
               int64_t code_columns, int codes_per_byte, ffi::Buffer<ffi::F32>& scale, ffi::Buffer<ffi::F32>& offset,
               ffi::ResultBuffer<ffi::F32>& y) {
  auto xd = x.dimensions(), sd = scale.dimensions();
  const int64_t k = code_columns * codes_per_byte;
  if (xd.size() != 2 || sd.size() != 2 || xd[1] != k || sd[0] != code_rows || sd[1] == 0 || k % 32 != 0 ||
      (k / sd[1] != 32 && k / sd[1] != 16) || (codes_per_byte == 2 && k / sd[1] != 32)) {
    return ffi::Error::InvalidArgument(
        "block_q8_matmul: x [N, K], codes [O, K] (or nibble pairs [O, K / 2]), scale [O, K / block], block 16 or "
        "32 (32 for nibbles)");
  }
  Problem p{codes, scale.typed_data(), nullptr, y->typed_data(), xd[0], k, code_rows, k / sd[1], code_columns};
  if (offset.element_count() > 0) {
    if (offset.element_count() != scale.element_count())
      return ffi::Error::InvalidArgument("block_q8_matmul: offset must match scale (or be empty)");
    p.offset = offset.typed_data();
  }
  const bool nibbles = codes_per_byte == 2;
  const Activations a = quantize(x.typed_data(), p.n, p.k, p.block, p.offset != nullptr);
#ifdef EMBER_VNNI
  const Planes b = byte_planes(a, p.n, p.k, p.block, nibbles);
#else
  const Planes b;
#endif
  // the outputs split into ranges (whole row blocks) that the caller and the threads of XLA's own intra-op pool
  // claim in turn (its threads are the ones already running: threads of our own would compete with them for
  // the cores). The caller claims ranges too, so the call ends even when no pool thread is free (two kernels
  // running side by side on a two-thread pool); a task that starts after every range is claimed touches
  // nothing but `shared`. No output's arithmetic depends on which thread computes it.
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
  };
  const int64_t helpers = std::max<int64_t>(0, std::min<int64_t>(pool.num_threads(), p.o * p.n / 256) - 1);
  const int64_t ranges = helpers == 0 ? 1 : 4 * (helpers + 1);
  const int64_t size = ((p.o + ranges - 1) / ranges + kRowBlock - 1) / kRowBlock * kRowBlock;
  auto shared = std::make_shared<Shared>();
  auto work = [shared, &p, &a, &b, ranges, size, nibbles] {
    for (int64_t r; (r = shared->next.fetch_add(1)) < ranges;) {
      const int64_t first = std::min(p.o, r * size), last = std::min(p.o, (r + 1) * size);
      if (nibbles)
        weight_rows<32, true>(p, a, b, first, last);
      else if (p.block == 32)
        weight_rows<32, false>(p, a, b, first, last);
      else
        weight_rows<16, false>(p, a, b, first, last);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < ranges) std::this_thread::yield();
  return ffi::Error::Success();
}


ffi::Error BlockQ8MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> codes,
                             ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> offset,
                             ffi::ResultBuffer<ffi::F32> y) {
  auto cd = codes.dimensions();
  if (cd.size() != 2) return ffi::Error::InvalidArgument("block_q8_matmul: codes [O, K]");
  return Run(pool, x, reinterpret_cast<const uint8_t*>(codes.typed_data()), cd[0], cd[1], 1, scale, offset, y);
}

ffi::Error BlockQ4MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> codes,
                             ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> offset,
                             ffi::ResultBuffer<ffi::F32> y) {
  auto cd = codes.dimensions();
  if (cd.size() != 2) return ffi::Error::InvalidArgument("block_q8_matmul: nibble pairs [O, K / 2]");
  return Run(pool, x, codes.typed_data(), cd[0], cd[1], 2, scale, offset, y);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmberBlockQ8Matmul, BlockQ8MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmberBlockQ4Matmul, BlockQ4MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
