//! AVX2 + FMA + F16C kernels (`_mm256_maddubs_epi16` for the u8 x i8 products): the shared
//! x86 kernels, and for the 32-element block types prefill's panel ([`panel`]) and decode's
//! row quads ([`rows`]).
super::x86::x86_kernels!("avx2,fma,f16c", dot_u8i8_avx2);

pub(crate) mod panel;
pub(crate) mod rows;

/// The 32-element block types, as the kernels' constant parameter.
const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const Q8_0: u8 = 2;
const Q4_1: u8 = 3;
const Q5_1: u8 = 4;

/// Whether a type's blocks carry a min (Q4_1, Q5_1: against Q8_1, whose sums take it).
const fn with_min(t: u8) -> bool {
    matches!(t, Q4_1 | Q5_1)
}

/// Bytes of a weight block and of its activation block, and where the activations' quants start.
const fn layout(t: u8) -> (usize, usize, usize) {
    match t {
        Q4_0 => (18, 34, 2),
        Q5_0 => (22, 34, 2),
        Q8_0 => (34, 34, 2),
        Q5_1 => (24, 36, 4),
        _ => (20, 36, 4),
    }
}

/// Q5_1's levels (d, m, qh u32, 16 nibble bytes): the nibble, 16 added where the fifth bit is
/// set (as [`dot`]'s Q5_1 kernel makes them).
#[inline(always)]
unsafe fn q5_1_levels(b: *const u8) -> __m256i {
    _mm256_or_si256(
        bytes_from_nibbles_32(b.add(8)),
        _mm256_and_si256(bytes_from_bits_32(b.add(4)), _mm256_set1_epi8(16)),
    )
}

/// The quants of the block at `b` as 32 bytes in element order, as llama.cpp's AVX2 kernels
/// take them: signed (`q - 8`, `q - 16`, `q`), and Q4_1's and Q5_1's unsigned `q`.
#[inline(always)]
unsafe fn quants<const T: u8>(b: *const u8) -> __m256i {
    match T {
        Q4_0 => _mm256_sub_epi8(bytes_from_nibbles_32(b.add(2)), _mm256_set1_epi8(8)),
        // q - 16: the nibble with 0xf0 OR-ed in where the fifth bit is clear.
        Q5_0 => _mm256_or_si256(
            bytes_from_nibbles_32(b.add(6)),
            _mm256_andnot_si256(bytes_from_bits_32(b.add(2)), _mm256_set1_epi8(0xf0u8 as i8)),
        ),
        Q8_0 => _mm256_loadu_si256(b.add(2) as *const __m256i),
        Q5_1 => q5_1_levels(b),
        _ => bytes_from_nibbles_32(b.add(4)),
    }
}

/// The levels of the block at `b` for the unsigned `maddubs` operand where they fit one (32
/// bytes in element order): Q4_0's and Q4_1's nibbles, Q5_0's 5-bit `q + 16`, Q5_1's 5-bit
/// `q`; Q8_0's signed
/// `q` (it takes the sign trick). Q4_0's and Q5_0's offset ([`offset`]) comes off the sums.
#[inline(always)]
unsafe fn levels<const T: u8>(b: *const u8) -> __m256i {
    match T {
        Q4_0 => bytes_from_nibbles_32(b.add(2)),
        Q5_0 => _mm256_or_si256(
            bytes_from_nibbles_32(b.add(6)),
            _mm256_and_si256(bytes_from_bits_32(b.add(2)), _mm256_set1_epi8(0x10)),
        ),
        Q8_0 => _mm256_loadu_si256(b.add(2) as *const __m256i),
        Q5_1 => q5_1_levels(b),
        _ => bytes_from_nibbles_32(b.add(4)),
    }
}

/// What [`levels`] adds to Q4_0's and Q5_0's signed quants (0 for the others).
const fn offset(t: u8) -> i8 {
    match t {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    }
}
