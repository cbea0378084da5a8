//! AVX-512 VNNI kernels. The K-quant kernels are the shared AVX2 ones (from [`x86_kernels!`])
//! with `vpdpbusd` on 256-bit vectors via AVX512VL and 32 vector registers, which keep the
//! accumulators of 8-row groups in registers. The 32-element block types (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0) have their own 512-bit kernels below: two blocks per zmm, the 5th bits and the signs
//! as k-masks, each block's scale pair broadcast into its half of a zmm. Their f32 sums follow
//! llama.cpp's x86 kernels exactly (one 8-lane accumulator, blocks in order, its horizontal
//! sum, the mins fused-multiply-added in order), so a dot is llama.cpp's bit for bit.
//!
//! Every row of a multi-row call goes through exactly the operations a single-row call does,
//! so `vec_dot_multi` results do not depend on the batch size (bit for bit).

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_u8i8_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
}

super::x86::x86_kernels!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dot_u8i8_vnni
);

/// The 512-bit kernel for `w`, if it has one; else the shared kernels.
///
/// # Safety
/// As [`dot`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot512<const N: usize>(
    w: GgmlType,
    nb: usize,
    x: *const u8,
    y: [*const u8; N],
) -> Option<[f32; N]> {
    Some(match w {
        GgmlType::Q4_0 => blocks32::<N, 0>(nb, x, y),
        GgmlType::Q5_0 => blocks32::<N, 1>(nb, x, y),
        GgmlType::Q8_0 => blocks32::<N, 2>(nb, x, y),
        GgmlType::Q4_1 => blocks32::<N, 3>(nb, x, y),
        GgmlType::Q5_1 => blocks32::<N, 4>(nb, x, y),
        GgmlType::Q4_K => ktile_q4k::<1, N>(nb, [x], y)[0],
        GgmlType::Q6_K => ktile_q6k::<1, N>(nb, [x], y, false)[0],
        _ => return dot::<N>(w, nb, x, y),
    })
}

const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const Q8_0: u8 = 2;
const Q4_1: u8 = 3;
const Q5_1: u8 = 4;

/// Whether a type's blocks carry a min (Q4_1, Q5_1: against Q8_1, whose sums take it).
const fn with_min(t: u8) -> bool {
    matches!(t, Q4_1 | Q5_1)
}

/// Two 5-bit blocks' levels (Q5_0's `q + 16`, Q5_1's `q`: the nibbles at `qs`, 16 added where
/// the fifth bit, of the u32 at `qh`, is set), the block at `xa` in the low half, the one at
/// `xb` in the high half (null: zeros).
#[inline(always)]
unsafe fn fifth_pair(xa: *const u8, xb: *const u8, qh: usize, qs: usize) -> __m512i {
    let nib = nibbles2(xa.add(qs), if xb.is_null() { xb } else { xb.add(qs) });
    let h0 = (xa.add(qh) as *const u32).read_unaligned() as u64;
    let h1 = if xb.is_null() {
        0
    } else {
        (xb.add(qh) as *const u32).read_unaligned() as u64
    };
    let set = _cvtu64_mask64(h0 | (h1 << 32));
    _mm512_mask_mov_epi8(nib, set, _mm512_or_si512(nib, _mm512_set1_epi8(0x10)))
}

/// Lanes 0..8 from the f16 at `p0`, lanes 8..16 from the f16 at `p1` (or 0.0 when null).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn halves2(p0: *const u8, p1: *const u8) -> __m512 {
    let h0 = _mm_set1_epi16((p0 as *const i16).read_unaligned());
    let h1 = if p1.is_null() {
        _mm_setzero_si128()
    } else {
        _mm_set1_epi16((p1 as *const i16).read_unaligned())
    };
    _mm512_cvtph_ps(_mm256_set_m128i(h1, h0))
}

/// 32 bytes at `p0` in the low half, 32 at `p1` (or zeros when null) in the high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn load2x32(p0: *const u8, p1: *const u8) -> __m512i {
    let lo = _mm512_zextsi256_si512(_mm256_loadu_si256(p0 as *const __m256i));
    if p1.is_null() {
        lo
    } else {
        _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(p1 as *const __m256i))
    }
}

/// Two blocks' 16 nibble bytes (at `p0`, `p1`) -> 64 bytes: block 0's low then high nibbles,
/// then block 1's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibbles2(p0: *const u8, p1: *const u8) -> __m512i {
    let t0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p0 as *const __m128i));
    let t = if p1.is_null() {
        _mm512_zextsi256_si512(t0)
    } else {
        let t1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p1 as *const __m128i));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(t0), t1)
    };
    // Per-u16 shift counts: 0 in the first and third 128-bit lanes, 4 in the others.
    const S4: i64 = 0x0004_0004_0004_0004;
    let shifts = _mm512_set_epi64(S4, S4, 0, 0, S4, S4, 0, 0);
    _mm512_and_si512(_mm512_srlv_epi16(t, shifts), _mm512_set1_epi8(0x0f))
}

/// Two blocks of `T` as the unsigned `vpdpbusd` operand (q + 8, q + 16, q + 128; Q4_1 and Q5_1
/// as is):
/// the block at `xa` in the low half, the one at `xb` in the high half (null: zeros). Every
/// offset-seeded kernel below decodes weights through this.
#[inline(always)]
unsafe fn unsigned_pair<const T: u8>(xa: *const u8, xb: *const u8) -> __m512i {
    let off = |p: *const u8, k: usize| if p.is_null() { p } else { p.add(k) };
    match T {
        Q4_0 => nibbles2(xa.add(2), off(xb, 2)),
        Q5_0 => fifth_pair(xa, xb, 2, 6),
        Q8_0 => _mm512_xor_si512(
            load2x32(xa.add(2), off(xb, 2)),
            _mm512_set1_epi8(0x80u8 as i8),
        ),
        Q5_1 => fifth_pair(xa, xb, 4, 8),
        _ => nibbles2(xa.add(4), off(xb, 4)),
    }
}

/// Bytes of one weight block of `T` and of its activation block.
const fn block_bytes(t: u8) -> (usize, usize) {
    match t {
        Q4_0 => (18, 34),
        Q5_0 => (22, 34),
        Q8_0 => (34, 34),
        Q5_1 => (24, 36),
        _ => (20, 36),
    }
}

/// One step over two blocks (`second` false: only the first, the upper half zero) into
/// accumulator set `acc`.
#[inline(always)]
unsafe fn step<const N: usize, const T: u8>(
    acc: &mut [__m256; N],
    summ: &mut [f32; N],
    xb: *const u8,
    y: &[*const u8; N],
    yoff: usize,
    second: bool,
) {
    let (bx, by) = block_bytes(T);
    let x1 = if second { xb.add(bx) } else { std::ptr::null() };
    let off = |p: *const u8, k: usize| if p.is_null() { p } else { p.add(k) };
    // Weight side, shared by all rows: 64 signed (or, Q4_1 and Q5_1, unsigned) quants and the
    // scales.
    let qx = match T {
        Q4_0 => _mm512_sub_epi8(nibbles2(xb.add(2), off(x1, 2)), _mm512_set1_epi8(8)),
        Q5_0 => {
            let nib = nibbles2(xb.add(6), off(x1, 6));
            let h0 = (xb.add(2) as *const u32).read_unaligned() as u64;
            let h1 = if second {
                (x1.add(2) as *const u32).read_unaligned() as u64
            } else {
                0xffff_ffff
            };
            // q - 16 = nibble | 0xf0 where the fifth bit is clear.
            let clear = _cvtu64_mask64(!(h0 | (h1 << 32)));
            _mm512_mask_mov_epi8(
                nib,
                clear,
                _mm512_or_si512(nib, _mm512_set1_epi8(0xf0u8 as i8)),
            )
        }
        Q8_0 => load2x32(xb.add(2), off(x1, 2)),
        Q5_1 => fifth_pair(xb, x1, 4, 8),
        _ => nibbles2(xb.add(4), off(x1, 4)),
    };
    let dx = halves2(xb, x1);
    if with_min(T) {
        let m0 = fp16(xb.add(2));
        let m1 = if second { fp16(x1.add(2)) } else { 0.0 };
        for c in 0..N {
            let yb = y[c].add(yoff);
            let y1 = if second { yb.add(by) } else { std::ptr::null() };
            summ[c] = m0.mul_add(fp16(yb.add(2)), summ[c]);
            if second {
                summ[c] = m1.mul_add(fp16(yb.add(by + 2)), summ[c]);
            }
            let qy = load2x32(yb.add(4), off(y1, 4));
            let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy);
            let d = _mm512_mul_ps(dx, halves2(yb, y1));
            acc[c] = fma_halves(d, _mm512_cvtepi32_ps(s), acc[c], second);
        }
        return;
    }
    // Sign trick: |qx| as the unsigned operand, qx's signs moved onto the activations.
    let ax = _mm512_abs_epi8(qx);
    let neg = _mm512_movepi8_mask(qx);
    for c in 0..N {
        let yb = y[c].add(yoff);
        let y1 = if second { yb.add(by) } else { std::ptr::null() };
        let qy = load2x32(yb.add(2), off(y1, 2));
        let sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy);
        let d = _mm512_mul_ps(dx, halves2(yb, y1));
        acc[c] = fma_halves(d, _mm512_cvtepi32_ps(s), acc[c], second);
    }
}

/// `acc = fma(d.lo, f.lo, acc)`, then (with `second`) `acc = fma(d.hi, f.hi, acc)`: the two
/// blocks of a zmm enter one 8-lane accumulator in block order, as llama.cpp's AVX2 kernels
/// accumulate (`acc = _mm256_fmadd_ps(d, q, acc)` per block), so the sums are its bit for bit.
#[inline(always)]
unsafe fn fma_halves(d: __m512, f: __m512, acc: __m256, second: bool) -> __m256 {
    let a = _mm256_fmadd_ps(_mm512_castps512_ps256(d), _mm512_castps512_ps256(f), acc);
    if !second {
        return a;
    }
    let hi = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_fmadd_ps(hi(d), hi(f), a)
}

/// The 32-element block types (`T`: Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1), one
/// weight row against `N` activation rows, two blocks per zmm (decode's form: one row streams
/// sequentially; measured 20% faster than the row-paired kernel there), the same f32 order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn blocks32<const N: usize, const T: u8>(
    nb: usize,
    x: *const u8,
    y: [*const u8; N],
) -> [f32; N] {
    let (bx, by) = block_bytes(T);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summ = [0f32; N];
    let mut i = 0;
    while i < nb {
        let two = i + 2 <= nb;
        step::<N, T>(&mut acc, &mut summ, x.add(i * bx), &y, i * by, two);
        i += if two { 2 } else { 1 };
    }
    let mut out = [0f32; N];
    for c in 0..N {
        out[c] = hsum8(acc[c]) + summ[c];
    }
    out
}

/// Register tile of the K-quant kernel ([`ktile`]): weight rows x activation rows per call.
pub(crate) const KTILE_W: usize = 4;
pub(crate) const KTILE_A: usize = 4;

/// Whether [`tile`] has a kernel for `w`.
pub(crate) fn has_tile(w: GgmlType) -> bool {
    matches!(w, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// `MR` weight rows x `NR` activation rows of a K-quant (Q4_K, Q6_K): the micro-kernel behind
/// `vec_dot_rows` for them ([`ktile`]); `batched` selects llama.cpp's tiled Q6_K order.
///
/// # Safety
/// As [`dot`]; `w` is Q4_K or Q6_K.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile<const MR: usize, const NR: usize>(
    w: GgmlType,
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
    batched: bool,
) -> [[f32; NR]; MR] {
    match w {
        GgmlType::Q4_K => ktile_q4k::<MR, NR>(nb, x, y),
        _ => ktile_q6k::<MR, NR>(nb, x, y, batched),
    }
}

/// Bytes ahead of the current weight block that the decode kernels prefetch.
pub(crate) const PREFETCH_AHEAD: usize = 3072;

mod ktile;
mod panel;
mod pre;

pub(crate) use ktile::matvec_k;
use ktile::{ktile_q4k, ktile_q6k};
pub(crate) use panel::Panel;
pub(crate) use pre::{matvec_pre, multi_pre, preact_fill, PreAct};
