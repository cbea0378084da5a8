//! AVX-512 VNNI kernels. The K-quant kernels are the shared AVX2 ones (from [`x86_kernels!`])
//! with `vpdpbusd` on 256-bit vectors via AVX512VL and 32 vector registers, which keep the
//! accumulators of 8-row groups in registers. The 32-element block types (Q4_0, Q4_1, Q5_0,
//! Q8_0) have their own 512-bit kernels below: two blocks per zmm, the 5th bits and the signs
//! as k-masks, each block's scale pair broadcast into its half of a zmm, and two accumulators
//! per activation row (even and odd block pairs) so the FMA latency never chains the loop.
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
        _ => return dot::<N>(w, nb, x, y),
    })
}

const Q4_0: u8 = 0;
const Q5_0: u8 = 1;
const Q8_0: u8 = 2;
const Q4_1: u8 = 3;

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

/// One step over two blocks (`second` false: only the first, the upper half zero) into
/// accumulator set `acc`.
#[inline(always)]
unsafe fn step<const N: usize, const T: u8>(
    acc: &mut [__m512; N],
    summ: &mut [f32; N],
    xb: *const u8,
    y: &[*const u8; N],
    yoff: usize,
    second: bool,
) {
    let bx: usize = match T {
        Q4_0 => 18,
        Q5_0 => 22,
        Q8_0 => 34,
        _ => 20,
    };
    let by: usize = if T == Q4_1 { 36 } else { 34 };
    let x1 = if second { xb.add(bx) } else { std::ptr::null() };
    let off = |p: *const u8, k: usize| if p.is_null() { p } else { p.add(k) };
    // Weight side, shared by all rows: 64 signed (or, Q4_1, unsigned) quants and the scales.
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
        _ => nibbles2(xb.add(4), off(x1, 4)),
    };
    let dx = halves2(xb, x1);
    if T == Q4_1 {
        let m0 = fp16(xb.add(2));
        let m1 = if second { fp16(x1.add(2)) } else { 0.0 };
        for c in 0..N {
            let yb = y[c].add(yoff);
            let y1 = if second { yb.add(by) } else { std::ptr::null() };
            let s1 = if second { fp16(yb.add(by + 2)) } else { 0.0 };
            summ[c] += m0 * fp16(yb.add(2)) + m1 * s1;
            let qy = load2x32(yb.add(4), off(y1, 4));
            let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy);
            let d = _mm512_mul_ps(dx, halves2(yb, y1));
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[c]);
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
        acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[c]);
    }
}

/// The 32-element block types (`T`: Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1 against Q8_1).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn blocks32<const N: usize, const T: u8>(
    nb: usize,
    x: *const u8,
    y: [*const u8; N],
) -> [f32; N] {
    let bx: usize = match T {
        Q4_0 => 18,
        Q5_0 => 22,
        Q8_0 => 34,
        _ => 20,
    };
    let by: usize = if T == Q4_1 { 36 } else { 34 };
    let mut acc0 = [_mm512_setzero_ps(); N];
    let mut acc1 = [_mm512_setzero_ps(); N];
    let mut summ0 = [0f32; N];
    let mut summ1 = [0f32; N];
    let mut i = 0;
    while i + 4 <= nb {
        step::<N, T>(&mut acc0, &mut summ0, x.add(i * bx), &y, i * by, true);
        step::<N, T>(
            &mut acc1,
            &mut summ1,
            x.add((i + 2) * bx),
            &y,
            (i + 2) * by,
            true,
        );
        i += 4;
    }
    while i < nb {
        let two = i + 2 <= nb;
        step::<N, T>(&mut acc0, &mut summ0, x.add(i * bx), &y, i * by, two);
        i += if two { 2 } else { 1 };
    }
    let mut out = [0f32; N];
    for c in 0..N {
        out[c] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[c], acc1[c])) + (summ0[c] + summ1[c]);
    }
    out
}

/// Register tile for [`tile`]: weight rows x activation rows per call.
pub(crate) const TILE_W: usize = 4;
pub(crate) const TILE_A: usize = 2;

/// Whether [`tile`] has a kernel for `w`.
pub(crate) fn has_tile(w: GgmlType) -> bool {
    matches!(
        w,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// `MR` weight rows x `NR` activation rows, the GEMM-style micro-kernel behind `vec_dot_rows`.
/// The weight quants enter `vpdpbusd` unsigned (q + 8, q + 16, q + 128; Q4_1 as is) and each
/// activation block's offset correction (-off * its sums of four) seeds the i32 accumulator,
/// so the per-pair work is four instructions (dpbusd, convert, scale, FMA) and all the rest is
/// shared along a row or a column of the tile. The integer lane sums, the scales and the f32
/// accumulation order are exactly [`blocks32`]'s, so results equal `vec_dot_multi`'s bit for bit.
///
/// # Safety
/// As [`dot`]; `w` is one of [`has_tile`]'s types.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile<const MR: usize, const NR: usize>(
    w: GgmlType,
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
) -> [[f32; NR]; MR] {
    match w {
        GgmlType::Q4_0 => tile_t::<MR, NR, Q4_0>(nb, x, y),
        GgmlType::Q5_0 => tile_t::<MR, NR, Q5_0>(nb, x, y),
        GgmlType::Q8_0 => tile_t::<MR, NR, Q8_0>(nb, x, y),
        _ => tile_t::<MR, NR, Q4_1>(nb, x, y),
    }
}

#[inline(always)]
unsafe fn tile_step<const MR: usize, const NR: usize, const T: u8>(
    acc: &mut [[__m512; NR]; MR],
    summ: &mut [[f32; NR]; MR],
    x: &[*const u8; MR],
    y: &[*const u8; NR],
    blk: usize,
    second: bool,
) {
    let bx: usize = match T {
        Q4_0 => 18,
        Q5_0 => 22,
        Q8_0 => 34,
        _ => 20,
    };
    let by: usize = if T == Q4_1 { 36 } else { 34 };
    let off = |p: *const u8, k: usize| if p.is_null() { p } else { p.add(k) };
    // Activation side: quants, scales, offset corrections (and Q8_1 sums).
    let mut qy = [_mm512_setzero_si512(); NR];
    let mut dy = [_mm512_setzero_ps(); NR];
    let mut seed = [_mm512_setzero_si512(); NR];
    let mut sy = [[0f32; 2]; NR];
    for c in 0..NR {
        let yb = y[c].add(blk * by);
        let y1 = if second { yb.add(by) } else { std::ptr::null() };
        if T == Q4_1 {
            qy[c] = load2x32(yb.add(4), off(y1, 4));
            sy[c] = [
                fp16(yb.add(2)),
                if second { fp16(yb.add(by + 2)) } else { 0.0 },
            ];
        } else {
            qy[c] = load2x32(yb.add(2), off(y1, 2));
            let o: i8 = match T {
                Q4_0 => 8,
                Q5_0 => 16,
                _ => -128, // 0x80: 128 as the unsigned operand
            };
            let corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(o), qy[c]);
            seed[c] = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
        }
        dy[c] = halves2(yb, y1);
    }
    for r in 0..MR {
        let xb = x[r].add(blk * bx);
        let x1 = if second { xb.add(bx) } else { std::ptr::null() };
        let u = match T {
            Q4_0 => nibbles2(xb.add(2), off(x1, 2)),
            Q5_0 => {
                let nib = nibbles2(xb.add(6), off(x1, 6));
                let h0 = (xb.add(2) as *const u32).read_unaligned() as u64;
                let h1 = if second {
                    (x1.add(2) as *const u32).read_unaligned() as u64
                } else {
                    0
                };
                let set = _cvtu64_mask64(h0 | (h1 << 32));
                _mm512_mask_mov_epi8(nib, set, _mm512_or_si512(nib, _mm512_set1_epi8(0x10)))
            }
            Q8_0 => _mm512_xor_si512(
                load2x32(xb.add(2), off(x1, 2)),
                _mm512_set1_epi8(0x80u8 as i8),
            ),
            _ => nibbles2(xb.add(4), off(x1, 4)),
        };
        let dx = halves2(xb, x1);
        let m = if T == Q4_1 {
            [fp16(xb.add(2)), if second { fp16(x1.add(2)) } else { 0.0 }]
        } else {
            [0.0; 2]
        };
        for c in 0..NR {
            if T == Q4_1 {
                summ[r][c] += m[0] * sy[c][0] + m[1] * sy[c][1];
            }
            let s = _mm512_dpbusd_epi32(seed[c], u, qy[c]);
            let d = _mm512_mul_ps(dx, dy[c]);
            acc[r][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[r][c]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_t<const MR: usize, const NR: usize, const T: u8>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
) -> [[f32; NR]; MR] {
    let mut acc0 = [[_mm512_setzero_ps(); NR]; MR];
    let mut acc1 = [[_mm512_setzero_ps(); NR]; MR];
    let mut summ0 = [[0f32; NR]; MR];
    let mut summ1 = [[0f32; NR]; MR];
    let mut i = 0;
    while i + 4 <= nb {
        tile_step::<MR, NR, T>(&mut acc0, &mut summ0, &x, &y, i, true);
        tile_step::<MR, NR, T>(&mut acc1, &mut summ1, &x, &y, i + 2, true);
        i += 4;
    }
    while i < nb {
        let two = i + 2 <= nb;
        tile_step::<MR, NR, T>(&mut acc0, &mut summ0, &x, &y, i, two);
        i += if two { 2 } else { 1 };
    }
    let mut out = [[0f32; NR]; MR];
    for r in 0..MR {
        for c in 0..NR {
            out[r][c] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r][c], acc1[r][c]))
                + (summ0[r][c] + summ1[r][c]);
        }
    }
    out
}
