// The AVX-512 VNNI form of block_q8.cc's kernel (included by it, inside its namespace, where the compiler targets
// AVX512-VNNI, -VL and -BW: Zen 4, Ice Lake and later). The same numbers as the AVX2 form's integers: each
// block's dot of codes with the int16 activations is exact. Only the instructions differ.
//
// vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds them to an int32 lane: 32 products per 256-bit
// instruction, against vpmaddwd's 16 plus the add that follows it. The int16 activations q are split into two
// byte planes, q = 256 * hi + lo with hi = q >> 8 (int8) and lo = q & 255 (uint8), so
//   dot(code, q) = 256 * dot(code, hi) + dot(code, lo)
// which is exact. Q4_K's nibble codes (0..15) are already unsigned bytes and pair with hi directly; signed int8
// codes (Q6_K, Q8_0, Q5_0) pair with hi as code ^ 0x80 = code + 128, and the lane's accumulator starts at
// -128 * (the sum of its 4 high bytes), computed once per activation row. Both products with lo take the
// codes as the signed side. No codes are widened to int16 (the AVX2 form's largest cost with nibbles).
//
// A unit is 32 bytes of codes: two blocks (nibble pairs of blocks of 32, or int8 blocks of 16), lanes 0-3 one
// block and lanes 4-7 the next, or one int8 block of 32 (whose two halves are then folded into that shape). A
// group of 8 blocks reduces by three in-lane horizontal adds to one vector of exact block dots in the lane
// order [b0 b2 b4 b6 | b1 b3 b5 b7]; the activation scales are stored in that order, the weight's are permuted
// into it, and one convert + multiply + FMA per group adds the group to the row's float accumulator. Every
// output runs the same sequence for any N, row blocking or thread split (batch-invariant, like the AVX2 form);
// both layouts of Q4_K give the same bits, since the block dots are the same integers.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define EMBER_VNNI 1

// The activations as byte planes in the codes' byte order, zero-padded to whole groups of 8 blocks.
// Nibble layouts take each 64 elements as [0..15, 32..47 | 16..31, 48..63]: a unit's low nibbles are codes
// 0..15 of its two blocks, its high nibbles codes 16..31.
struct BytePlanes {
  std::vector<int8_t> hi;     // [N, k_padded]
  std::vector<uint8_t> lo;    // [N, k_padded]
  std::vector<int32_t> bias;  // [N, k_padded / 4]: -128 * the sum of each lane's 4 high bytes (int8 codes only)
  std::vector<float> scale;   // [N, blocks_padded]: each block's activation scale, in the group's lane order
  int64_t k_padded = 0;
};

BytePlanes byte_planes(const Activations& a, int64_t n, int64_t k, int64_t block, bool nibbles) {
  const int64_t kp = a.blocks_padded * block;
  BytePlanes b{std::vector<int8_t>(n * kp, 0), std::vector<uint8_t>(n * kp, 0), {}, std::vector<float>(a.scale.size()), kp};
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      int64_t at = i;
      if (nibbles) {  // within each 64: [0..15, 32..47, 16..31, 48..63]
        const int64_t quarter = (i & 63) >> 4;
        at = (i & ~int64_t{63}) + (quarter == 1 ? 32 : quarter == 2 ? 16 : 0) + (i & 15) + (quarter == 3 ? 48 : 0);
      }
      const int16_t q = a.q[r * k + i];
      b.hi[r * kp + at] = static_cast<int8_t>(q >> 8);
      b.lo[r * kp + at] = static_cast<uint8_t>(q & 0xFF);
    }
    for (int64_t g = 0; g < a.blocks_padded; g += 8)
      for (int j = 0; j < 8; ++j)  // lane j holds block g + (j < 4 ? 2 j : 2 (j - 4) + 1)
        b.scale[r * a.blocks_padded + g + j] = a.scale[r * a.blocks_padded + g + (j < 4 ? 2 * j : 2 * (j - 4) + 1)];
  }
  if (!nibbles) {
    b.bias.assign(n * kp / 4, 0);
    for (int64_t i = 0; i < n * kp / 4; ++i)
      b.bias[i] = -128 * (b.hi[4 * i] + b.hi[4 * i + 1] + b.hi[4 * i + 2] + b.hi[4 * i + 3]);
  }
  return b;
}

struct UnitCodes {
  __m256i a, b;  // nibbles: codes 0..15 and 16..31 of the unit's blocks; int8: code + 128 (unsigned), code
};

template <bool NIBBLES, bool WHOLE>
inline UnitCodes load_unit(const uint8_t* c) {
  // WHOLE: 32 bytes; else the unit's first block only (16 bytes: the row's last block), the rest zeros
  const __m256i bytes = WHOLE ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c))
                              : _mm256_maskz_loadu_epi8(0x0000FFFFu, c);
  if constexpr (NIBBLES) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    return {_mm256_and_si256(bytes, low4), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4)};
  } else {
    return {_mm256_xor_si256(bytes, _mm256_set1_epi8(static_cast<char>(0x80))), bytes};
  }
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// One unit's 8 int32 lanes against one activation row: lane sums of the exact dot (h, l at the unit's elements)
template <bool NIBBLES>
inline __m256i unit_dot(const UnitCodes& u, const int8_t* h, const uint8_t* l, const int32_t* bias) {
  __m256i high, low;
  if constexpr (NIBBLES) {
    high = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u.a, load256(h)), u.b, load256(h + 32));
    low = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), load256(l), u.a), load256(l + 32), u.b);
  } else {
    high = _mm256_dpbusd_epi32(load256(bias), u.a, load256(h));
    low = _mm256_dpbusd_epi32(_mm256_setzero_si256(), load256(l), u.b);
  }
  return _mm256_add_epi32(_mm256_slli_epi32(high, 8), low);
}

// Blocks g..g+7 of one weight row against RN activation rows -> per row [b0 b2 b4 b6 | b1 b3 b5 b7] (exact
// block dots; zeros past `count` blocks). h / l / bias point at the group's first element (lane) of each row.
template <int BLOCK, bool NIBBLES, bool FULL, int RN>
inline void group_dots(const uint8_t* c, const int8_t* const h[RN], const uint8_t* const l[RN],
                       const int32_t* const bias[RN], int count, __m256i out[RN]) {
  constexpr bool kPaired = NIBBLES || BLOCK == 16;  // two blocks per 32 code bytes
  constexpr int kUnits = kPaired ? 4 : 8, kBlocksPerUnit = kPaired ? 2 : 1, kElements = NIBBLES ? 64 : 32;
  __m256i v[RN][kUnits];
  for (int u = 0; u < kUnits; ++u) {
    const int left = count - u * kBlocksPerUnit;
    if (!FULL && left <= 0) {
      for (int n = 0; n < RN; ++n) v[n][u] = _mm256_setzero_si256();
      continue;
    }
    const UnitCodes codes = (FULL || left >= kBlocksPerUnit) ? load_unit<NIBBLES, true>(c + 32 * u)
                                                             : load_unit<NIBBLES, false>(c + 32 * u);
    for (int n = 0; n < RN; ++n)
      v[n][u] = unit_dot<NIBBLES>(codes, h[n] + kElements * u, l[n] + kElements * u,
                                  NIBBLES ? nullptr : bias[n] + 8 * u);
  }
  for (int n = 0; n < RN; ++n) {
    __m256i p[4];
    if constexpr (kPaired) {
      for (int j = 0; j < 4; ++j) p[j] = v[n][j];
    } else {  // blocks 2j and 2j + 1, each across 8 lanes -> [2j's halves summed | 2j + 1's halves summed]
      for (int j = 0; j < 4; ++j)
        p[j] = _mm256_add_epi32(_mm256_permute2x128_si256(v[n][2 * j], v[n][2 * j + 1], 0x20),
                                _mm256_permute2x128_si256(v[n][2 * j], v[n][2 * j + 1], 0x31));
    }
    out[n] = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  }
}

constexpr int kStreamAhead = 2048;  // bytes of codes ahead of a one-row pass (measured: 1 KB too few, 4 KB no better)

// When one activation row multiplies a weight whose planes fit in L1 (3 bytes per element: K <= 4096), the weight
// is read one row at a time (RO = 1): one sequential stream from memory instead of 4 side by side, 1.2-2x
// faster where the weight comes from memory (Zen 4; docs/cpu_target.md). Longer rows take blocks of 4 rows:
// reading the planes again per row would cost more from L2 than the interleaved streams do.
inline bool one_row_at_a_time(const Problem& p) { return p.n == 1 && p.k <= 4096; }

template <int BLOCK, bool NIBBLES, int RO, int RN>
void vnni_rows_x_activations(const Problem& p, const Activations& a, const BytePlanes& b, int64_t o0, int64_t n0) {
  const int64_t nb = p.k / BLOCK;
  constexpr int kGroupBytes = kGroup * BLOCK / (NIBBLES ? 2 : 1);
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  __m256 acc[RO][RN];
  for (int r = 0; r < RO; ++r)
    for (int n = 0; n < RN; ++n) acc[r][n] = _mm256_setzero_ps();
  for (int64_t g = 0; g < nb; g += kGroup) {
    const int count = static_cast<int>(std::min<int64_t>(kGroup, nb - g));
    const int8_t* h[RN];
    const uint8_t* l[RN];
    const int32_t* bias[RN];
    for (int n = 0; n < RN; ++n) {
      h[n] = b.hi.data() + (n0 + n) * b.k_padded + g * BLOCK;
      l[n] = b.lo.data() + (n0 + n) * b.k_padded + g * BLOCK;
      bias[n] = NIBBLES ? nullptr : b.bias.data() + ((n0 + n) * b.k_padded + g * BLOCK) / 4;
    }
    for (int r = 0; r < RO; ++r) {
      const int64_t row = o0 + r;
      const uint8_t* c = p.codes + row * p.row_bytes + g / kGroup * kGroupBytes;
      // one row at a time reads the codes (and the scales) as one sequential stream: fetch kStreamAhead bytes
      // ahead; blocks of rows read RO streams side by side: fetch the same place PREFETCH_ROWS rows on
      const int64_t ahead_rows = RO == 1 ? 0 : PREFETCH_ROWS;
      const char* ahead = reinterpret_cast<const char*>(c + ahead_rows * p.row_bytes) + (RO == 1 ? kStreamAhead : 0);
      for (int line = 0; line < kGroupBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
      const int64_t scale_ahead = RO == 1 ? kStreamAhead * 4 / (kGroupBytes / kGroup) : 0;  // bytes of scales
      _mm_prefetch(reinterpret_cast<const char*>(p.scale + (row + ahead_rows) * nb + g) + scale_ahead, _MM_HINT_T0);
      if (p.offset)
        _mm_prefetch(reinterpret_cast<const char*>(p.offset + (row + ahead_rows) * nb + g) + scale_ahead, _MM_HINT_T0);
      __m256i dots[RN];
      if (count == kGroup)
        group_dots<BLOCK, NIBBLES, true, RN>(c, h, l, bias, count, dots);
      else
        group_dots<BLOCK, NIBBLES, false, RN>(c, h, l, bias, count, dots);
      const __m256 w = _mm256_permutexvar_ps(order, load8(p.scale + row * nb + g, count));
      for (int n = 0; n < RN; ++n) {
        const __m256 s = _mm256_mul_ps(w, _mm256_loadu_ps(b.scale.data() + (n0 + n) * a.blocks_padded + g));
        acc[r][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[n]), s, acc[r][n]);
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

#endif
