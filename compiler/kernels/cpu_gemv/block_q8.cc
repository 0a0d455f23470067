// x [N, K] f32 times a weight of int8 codes [O, K] with one scale (and optionally one offset) per block of B
// codes along K: y[n, o] = sum_b scale[o, b] * (x[n, b] . codes[o, b]) - offset[o, b] * sum(x[n, b]).
// A GGUF K-quant or Q8_0 / Q5_0 weight is exactly this form (compiler/kernels/cpu_gemv/layout.py), so the
// weight is read at ~1.1-1.5 bytes per element where the exact path reads fp32. The activations are quantized
// to int16 per 32 elements (the only rounding the kernel adds), so each 32-element dot is integer arithmetic.
//
// Each output (n, o) is computed by the same instruction sequence whatever N is and however the rows are
// grouped or the outputs split across threads: the result is batch-invariant (deterministic mode relies on it).
#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Problem {
  const float* x;       // [N, K]
  const int8_t* codes;  // [O, K]
  const float* scale;   // [O, nb]
  const float* offset;  // [O, nb] or null
  const float* xsum;    // [N, nb]: each block's sum of x (offsets only)
  float* y;             // [N, O]
  int64_t n, k, o, block;
};

// sum over blocks of offset[row, b] * sum(x[n, b]) (the K-quants' minimums), in block order
inline float offset_term(const Problem& p, int64_t n, int64_t row) {
  const int64_t nb = p.k / p.block;
  const float* m = p.offset + row * nb;
  const float* xs = p.xsum + n * nb;
  float total = 0.f;
  for (int64_t b = 0; b < nb; ++b) total += m[b] * xs[b];
  return total;
}

// x quantized per 32 elements to int16 (scale xs = max|x| / 32767, round to nearest: 2^-16 of the chunk's
// largest value, far below the float32 rounding the exact path's sums see over thousands of terms): a 32-element
// chunk's dot is exact integer arithmetic (|code| <= 128, |xq| <= 32767: 4 products per int32 lane < 2^31)
struct QuantizedRows {
  std::vector<int16_t> q;    // [N, K]
  std::vector<float> scale;  // [N, K / 32]
};

QuantizedRows quantize_rows(const float* x, int64_t n, int64_t k) {
  QuantizedRows out{std::vector<int16_t>(n * k), std::vector<float>(n * (k / 32))};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k / 32; ++c) {
      const float* v = x + r * k + c * 32;
      float amax = 0.f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(v[j]));
      float scale = amax / 32767.f, inv = amax > 0.f ? 32767.f / amax : 0.f;
      out.scale[r * (k / 32) + c] = scale;
      for (int j = 0; j < 32; ++j) out.q[r * k + c * 32 + j] = static_cast<int16_t>(std::nearbyint(v[j] * inv));
    }
  return out;
}

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// 32 codes . 32 int16 activations -> 8 int32 lanes (lane i: elements 2i, 2i + 1, 16 + 2i, 17 + 2i, so lanes 0-3
// hold the first 16 elements' sums only after the cross-lane fixup below); exact
inline __m256i dot32(const int8_t* codes, const int16_t* xq) {
  __m256i c0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  __m256i c1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16)));
  __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
  // p0 lane i: elements 2i, 2i + 1 (0..15); p1: 16 + 2i, 17 + 2i. For 16-element blocks lanes 0-3 of the
  // result must be block 0 and 4-7 block 1: hadd-free, pair p0's lanes (0-3 | 4-7) and p1's the same way
  __m256i p0 = _mm256_madd_epi16(c0, x0), p1 = _mm256_madd_epi16(c1, x1);
  // lanes 0-3: p0 lanes 0-3 + p0 lanes 4-7 (block 0); lanes 4-7: p1 lanes 0-3 + p1 lanes 4-7 (block 1)
  __m256i lo = _mm256_permute2x128_si256(p0, p1, 0x20), hi = _mm256_permute2x128_si256(p0, p1, 0x31);
  return _mm256_add_epi32(lo, hi);
}

// R activation rows against one weight row; every row's arithmetic is the same for any R.
template <int R>
void rows_x_weight(const Problem& p, const QuantizedRows& xq, int64_t n0, int64_t row) {
  const int64_t nb = p.k / p.block, chunks = p.k / 32;
  const int8_t* c = p.codes + row * p.k;
  const float* s = p.scale + row * nb;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    // the weight scale of each lane: one block of 32, or two blocks of 16 (lanes 0-3, 4-7)
    __m256 ws = p.block == 32 ? _mm256_set1_ps(s[ch])
                              : _mm256_set_m128(_mm_set1_ps(s[2 * ch + 1]), _mm_set1_ps(s[2 * ch]));
    for (int r = 0; r < R; ++r) {
      const int64_t n = n0 + r;
      __m256i dot = dot32(c + ch * 32, xq.q.data() + n * p.k + ch * 32);
      __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(xq.scale[n * chunks + ch]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float total = hsum(acc[r]);
    if (p.offset) total -= offset_term(p, n0 + r, row);
    p.y[(n0 + r) * p.o + row] = total;
  }
}
#else
template <int R>
void rows_x_weight(const Problem& p, const QuantizedRows& xq, int64_t n0, int64_t row) {
  const int64_t nb = p.k / p.block, chunks = p.k / 32;
  const int8_t* c = p.codes + row * p.k;
  for (int r = 0; r < R; ++r) {
    const int64_t n = n0 + r;
    float total = 0.f;
    for (int64_t ch = 0; ch < chunks; ++ch)
      for (int64_t half = 0; half < 32 / p.block; ++half) {
        int32_t dot = 0;
        const int64_t first = ch * 32 + half * p.block;
        for (int64_t j = first; j < first + p.block; ++j) dot += int32_t(c[j]) * int32_t(xq.q[n * p.k + j]);
        total += static_cast<float>(dot) * (p.scale[row * nb + first / p.block] * xq.scale[n * chunks + ch]);
      }
    if (p.offset) total -= offset_term(p, n, row);
    p.y[n * p.o + row] = total;
  }
}
#endif

void weight_rows(const Problem& p, const QuantizedRows& xq, int64_t first, int64_t last) {
  for (int64_t row = first; row < last; ++row) {
    int64_t n0 = 0;
    for (; n0 + 4 <= p.n; n0 += 4) rows_x_weight<4>(p, xq, n0, row);
    for (; n0 < p.n; ++n0) rows_x_weight<1>(p, xq, n0, row);
  }
}

ffi::Error BlockQ8MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> codes, ffi::Buffer<ffi::F32> scale,
                             ffi::Buffer<ffi::F32> offset, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), cd = codes.dimensions(), sd = scale.dimensions();
  if (xd.size() != 2 || cd.size() != 2 || sd.size() != 2 || xd[1] != cd[1] || sd[0] != cd[0] || sd[1] == 0 ||
      cd[1] % 32 != 0 || (cd[1] / sd[1] != 32 && cd[1] / sd[1] != 16)) {
    return ffi::Error::InvalidArgument("block_q8_matmul: x [N, K], codes [O, K], scale [O, K / block], block 16 or 32");
  }
  Problem p{x.typed_data(), codes.typed_data(), scale.typed_data(), nullptr, nullptr, y->typed_data(),
            xd[0], xd[1], cd[0], cd[1] / sd[1]};
  const int64_t nb = sd[1];
  std::vector<float> xsum;
  if (offset.element_count() > 0) {
    if (offset.element_count() != scale.element_count())
      return ffi::Error::InvalidArgument("block_q8_matmul: offset must match scale (or be empty)");
    p.offset = offset.typed_data();
    xsum.resize(p.n * nb);
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        float total = 0.f;
        for (int64_t j = 0; j < p.block; ++j) total += p.x[n * p.k + b * p.block + j];
        xsum[n * nb + b] = total;
      }
    p.xsum = xsum.data();
  }
  const QuantizedRows xq = quantize_rows(p.x, p.n, p.k);
  // the outputs split into ranges that the caller and the threads of XLA's own intra-op pool claim in turn (its
  // threads are the ones already running: threads of our own would compete with them for the cores). The
  // caller claims ranges too, so the call ends even when no pool thread is free (two kernels running side by
  // side on a two-thread pool); a task that starts after every range is claimed touches nothing but `shared`.
  // No row's arithmetic depends on which thread computes it.
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
  };
  const int64_t helpers = std::max<int64_t>(0, std::min<int64_t>(pool.num_threads(), p.o / 256) - 1);
  const int64_t ranges = helpers == 0 ? 1 : 4 * (helpers + 1), size = (p.o + ranges - 1) / ranges;
  auto shared = std::make_shared<Shared>();
  auto work = [shared, &p, &xq, ranges, size] {
    for (int64_t r; (r = shared->next.fetch_add(1)) < ranges;) {
      weight_rows(p, xq, std::min(p.o, r * size), std::min(p.o, (r + 1) * size));
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < ranges) std::this_thread::yield();
  return ffi::Error::Success();
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
