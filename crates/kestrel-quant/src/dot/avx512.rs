//! AVX-512 VNNI kernels. The K-quant kernels are the shared AVX2 ones (from [`x86_kernels!`])
//! with `vpdpbusd` on 256-bit vectors via AVX512VL and 32 vector registers, which keep the
//! accumulators of 8-row groups in registers. The 32-element block types (Q4_0, Q4_1, Q5_0,
//! Q8_0) have their own 512-bit kernels below: two blocks per zmm, the 5th bits and the signs
//! as k-masks, each block's scale pair broadcast into its half of a zmm. Their f32 sums follow
//! llama.cpp's x86 kernels exactly (one 8-lane accumulator, blocks in order, its horizontal
//! sum, Q4_1's mins fused-multiply-added in order), so a dot is llama.cpp's bit for bit.
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
        GgmlType::Q4_K => ktile_q4k::<1, N>(nb, [x], y)[0],
        GgmlType::Q6_K => ktile_q6k::<1, N>(nb, [x], y, false)[0],
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

/// Two blocks of `T` as the unsigned `vpdpbusd` operand (q + 8, q + 16, q + 128; Q4_1 as is):
/// the block at `xa` in the low half, the one at `xb` in the high half (null: zeros). Every
/// offset-seeded kernel below decodes weights through this.
#[inline(always)]
unsafe fn unsigned_pair<const T: u8>(xa: *const u8, xb: *const u8) -> __m512i {
    let off = |p: *const u8, k: usize| if p.is_null() { p } else { p.add(k) };
    match T {
        Q4_0 => nibbles2(xa.add(2), off(xb, 2)),
        Q5_0 => {
            let nib = nibbles2(xa.add(6), off(xb, 6));
            let h0 = (xa.add(2) as *const u32).read_unaligned() as u64;
            let h1 = if xb.is_null() {
                0
            } else {
                (xb.add(2) as *const u32).read_unaligned() as u64
            };
            let set = _cvtu64_mask64(h0 | (h1 << 32));
            _mm512_mask_mov_epi8(nib, set, _mm512_or_si512(nib, _mm512_set1_epi8(0x10)))
        }
        Q8_0 => _mm512_xor_si512(
            load2x32(xa.add(2), off(xb, 2)),
            _mm512_set1_epi8(0x80u8 as i8),
        ),
        _ => nibbles2(xa.add(4), off(xb, 4)),
    }
}

/// Bytes of one weight block of `T` and of its activation block.
const fn block_bytes(t: u8) -> (usize, usize) {
    match t {
        Q4_0 => (18, 34),
        Q5_0 => (22, 34),
        Q8_0 => (34, 34),
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

/// The 32-element block types (`T`: Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1 against Q8_1), one
/// weight row against `N` activation rows, two blocks per zmm (decode's form: one row streams
/// sequentially; measured 20% faster than the row-paired kernel there), the same f32 order.
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

/// Whether `w` is one of the row-paired 32-element block types.
pub(crate) fn has_pair_tile(w: GgmlType) -> bool {
    matches!(
        w,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// Whether [`tile`] has a kernel for `w`.
pub(crate) fn has_tile(w: GgmlType) -> bool {
    matches!(
        w,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q6_K
    )
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

/// One activation row of a 32-element block type prepared once per matvec, per pair of blocks:
/// the quants of both blocks, their offset corrections as `vpdpbusd` seeds, their scales in
/// each half (and Q8_1's sums), so each weight row's pass does only its own work.
pub(crate) struct PreAct {
    qy: Vec<__m512i>,
    seed: Vec<__m512i>,
    dy: Vec<__m512>,
    sy: Vec<[f32; 2]>,
}

impl PreAct {
    pub(crate) fn new() -> Self {
        Self {
            qy: Vec::new(),
            seed: Vec::new(),
            dy: Vec::new(),
            sy: Vec::new(),
        }
    }
}

/// Fills `pre` from the activation row at `y` (`nb` blocks of `vec_dot_type(w)`).
///
/// # Safety
/// AVX-512 VNNI is available; `w` is a [`has_pair_tile`] type; `y` holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn preact_fill(w: GgmlType, nb: usize, y: *const u8, pre: &mut PreAct) {
    let t = match w {
        GgmlType::Q4_0 => Q4_0,
        GgmlType::Q5_0 => Q5_0,
        GgmlType::Q8_0 => Q8_0,
        _ => Q4_1,
    };
    let (_, by) = block_bytes(t);
    pre.qy.clear();
    pre.seed.clear();
    pre.dy.clear();
    pre.sy.clear();
    let mut i = 0;
    while i < nb {
        let two = i + 2 <= nb;
        let y0 = y.add(i * by);
        let y1 = if two { y0.add(by) } else { std::ptr::null() };
        let off = |p: *const u8, k: usize| if p.is_null() { p } else { p.add(k) };
        let q = if t == Q4_1 {
            load2x32(y0.add(4), off(y1, 4))
        } else {
            load2x32(y0.add(2), off(y1, 2))
        };
        let o: i8 = match t {
            Q4_0 => 8,
            Q5_0 => 16,
            Q8_0 => -128,
            _ => 0,
        };
        let corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(o), q);
        pre.qy.push(q);
        pre.seed
            .push(_mm512_sub_epi32(_mm512_setzero_si512(), corr));
        pre.dy.push(halves2(y0, y1));
        if t == Q4_1 {
            pre.sy
                .push([fp16(y0.add(2)), if two { fp16(y1.add(2)) } else { 0.0 }]);
        }
        i += 2;
    }
}

/// `out[r] = row r . act` for `out.len()` rows at `x` (`row_bytes` apart) against a prepared
/// activation: per row two blocks per zmm in block order, llama.cpp's 8-lane f32 order (the
/// same results as every other kernel here).
///
/// # Safety
/// As [`preact_fill`]; `pre` was filled for `w` and `nb`; the rows hold `nb` blocks each.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn matvec_pre(
    w: GgmlType,
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    pre: &PreAct,
    out: &mut [f32],
) {
    match w {
        GgmlType::Q4_0 => matvec_pre_t::<Q4_0>(nb, x, row_bytes, pre, out),
        GgmlType::Q5_0 => matvec_pre_t::<Q5_0>(nb, x, row_bytes, pre, out),
        GgmlType::Q8_0 => matvec_pre_t::<Q8_0>(nb, x, row_bytes, pre, out),
        _ => matvec_pre_t::<Q4_1>(nb, x, row_bytes, pre, out),
    }
}

#[inline(always)]
unsafe fn matvec_pre_t<const T: u8>(
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    pre: &PreAct,
    out: &mut [f32],
) {
    let (bx, _) = block_bytes(T);
    for (r, o) in out.iter_mut().enumerate() {
        let xr = x.add(r * row_bytes);
        let mut acc = _mm256_setzero_ps();
        let mut summ = 0f32;
        let mut i = 0;
        let mut j = 0;
        while i < nb {
            let two = i + 2 <= nb;
            let xa = xr.add(i * bx);
            // One core streams the rows alone: keep a few lines in flight ahead of it (the
            // rows are contiguous, so running past a row's end prefetches the next one).
            _mm_prefetch::<_MM_HINT_T0>(xa.add(PREFETCH_AHEAD) as *const i8);
            let xb = if two { xa.add(bx) } else { std::ptr::null() };
            let u = unsigned_pair::<T>(xa, xb);
            let dx = halves2(xa, xb);
            if T == Q4_1 {
                let sy = *pre.sy.get_unchecked(j);
                summ = fp16(xa.add(2)).mul_add(sy[0], summ);
                if two {
                    summ = fp16(xb.add(2)).mul_add(sy[1], summ);
                }
            }
            let s = _mm512_dpbusd_epi32(*pre.seed.get_unchecked(j), u, *pre.qy.get_unchecked(j));
            let d = _mm512_mul_ps(dx, *pre.dy.get_unchecked(j));
            acc = fma_halves(d, _mm512_cvtepi32_ps(s), acc, two);
            i += 2;
            j += 1;
        }
        *o = hsum8(acc) + summ;
    }
}

/// Several prepared activation rows (2..=7, a batched decode step) against `rows` weight rows
/// at `x`: `out[r * N + c]`, each weight pair of blocks decoded once for all `N`.
///
/// # Safety
/// As [`matvec_pre`], with `N` prepared rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn multi_pre<const N: usize>(
    w: GgmlType,
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    rows: usize,
    pre: &[PreAct],
    out: &mut [f32],
) {
    match w {
        GgmlType::Q4_0 => multi_pre_t::<N, Q4_0>(nb, x, row_bytes, rows, pre, out),
        GgmlType::Q5_0 => multi_pre_t::<N, Q5_0>(nb, x, row_bytes, rows, pre, out),
        GgmlType::Q8_0 => multi_pre_t::<N, Q8_0>(nb, x, row_bytes, rows, pre, out),
        _ => multi_pre_t::<N, Q4_1>(nb, x, row_bytes, rows, pre, out),
    }
}

#[inline(always)]
unsafe fn multi_pre_t<const N: usize, const T: u8>(
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    rows: usize,
    pre: &[PreAct],
    out: &mut [f32],
) {
    let (bx, _) = block_bytes(T);
    for r in 0..rows {
        let xr = x.add(r * row_bytes);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut summ = [0f32; N];
        let mut i = 0;
        let mut j = 0;
        while i < nb {
            let two = i + 2 <= nb;
            let xa = xr.add(i * bx);
            _mm_prefetch::<_MM_HINT_T0>(xa.add(PREFETCH_AHEAD) as *const i8);
            let xb = if two { xa.add(bx) } else { std::ptr::null() };
            let u = unsigned_pair::<T>(xa, xb);
            let dx = halves2(xa, xb);
            let m = if T == Q4_1 {
                [fp16(xa.add(2)), if two { fp16(xb.add(2)) } else { 0.0 }]
            } else {
                [0.0; 2]
            };
            for c in 0..N {
                let p = pre.get_unchecked(c);
                if T == Q4_1 {
                    let sy = *p.sy.get_unchecked(j);
                    summ[c] = m[0].mul_add(sy[0], summ[c]);
                    if two {
                        summ[c] = m[1].mul_add(sy[1], summ[c]);
                    }
                }
                let s = _mm512_dpbusd_epi32(*p.seed.get_unchecked(j), u, *p.qy.get_unchecked(j));
                let d = _mm512_mul_ps(dx, *p.dy.get_unchecked(j));
                acc[c] = fma_halves(d, _mm512_cvtepi32_ps(s), acc[c], two);
            }
            i += 2;
            j += 1;
        }
        for c in 0..N {
            out[r * N + c] = hsum8(acc[c]) + summ[c];
        }
    }
}

/// Weight rows of a 32-element block type decoded once for a whole batch of activation rows,
/// in quads of four rows: per row and block the signed quants (32 bytes: `q - 8`, `q - 16`,
/// `q`; Q4_1's `q` as is) and the `vpdpbusd` seed `-128 * (sum of each 4 quants)` that undoes
/// the activations' `+ 128` (they enter as the unsigned operand); per quad and block the four
/// rows' scales, each repeated four times (lane `4r + c`, ready to multiply by four tokens'
/// scales); per row and block (Q4_1) the min. Integer sums are exact, so this equals the
/// unsigned-weight form of [`matvec_pre`] bit for bit, and the per-token offset work moves to
/// the weights, which a panel decodes once for all tokens. Rows past the end of a quad are
/// zero.
pub(crate) struct Panel {
    /// `[quad][block][row]`
    x: Vec<__m256i>,
    /// `[quad][block][row]`
    seed: Vec<__m256i>,
    /// `[quad][block]`, lane `4r + c` = row r's scale.
    dx: Vec<__m512>,
    /// `[quad][block][row]`
    m: Vec<f32>,
    /// A tile's scale products, `[block]`, lane `4r + c` (scratch of [`panel_tile`]).
    prod: Vec<__m512>,
}

impl Panel {
    pub(crate) fn new() -> Self {
        Self {
            x: Vec::new(),
            seed: Vec::new(),
            dx: Vec::new(),
            m: Vec::new(),
            prod: Vec::new(),
        }
    }
}

/// Decodes rows `x` (1..=8) into `panel`, as `ceil(len / 4)` quads.
///
/// # Safety
/// AVX-512 VNNI is available; each row holds `nb` blocks of `w` (a [`has_pair_tile`] type).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn panel_fill(w: GgmlType, nb: usize, x: &[*const u8], panel: &mut Panel) {
    match w {
        GgmlType::Q4_0 => panel_fill_t::<Q4_0>(nb, x, panel),
        GgmlType::Q5_0 => panel_fill_t::<Q5_0>(nb, x, panel),
        GgmlType::Q8_0 => panel_fill_t::<Q8_0>(nb, x, panel),
        _ => panel_fill_t::<Q4_1>(nb, x, panel),
    }
}

#[inline(always)]
unsafe fn panel_fill_t<const T: u8>(nb: usize, x: &[*const u8], panel: &mut Panel) {
    let (bx, _) = block_bytes(T);
    let offset: i8 = match T {
        Q4_0 => 8,
        Q5_0 => 16,
        Q8_0 => -128,
        _ => 0,
    };
    let quads = x.len().div_ceil(4);
    panel.x.clear();
    panel.seed.clear();
    panel.dx.clear();
    panel.m.clear();
    let row = |r: usize| x.get(r).copied().unwrap_or(std::ptr::null());
    let at = |p: *const u8, i: usize| if p.is_null() { p } else { p.add(i * bx) };
    for q in 0..quads {
        let rows = [0, 1, 2, 3].map(|r| row(4 * q + r));
        for i in 0..nb {
            let mut dx = [0f32; 16];
            for pair in 0..2 {
                let (xa, xb) = (at(rows[2 * pair], i), at(rows[2 * pair + 1], i));
                if xa.is_null() {
                    // A quad's missing rows: zero quants, seed and scale.
                    panel.x.extend([_mm256_setzero_si256(); 2]);
                    panel.seed.extend([_mm256_setzero_si256(); 2]);
                    panel.m.extend([0.0; 2]);
                    continue;
                }
                let signed = _mm512_sub_epi8(unsigned_pair::<T>(xa, xb), _mm512_set1_epi8(offset));
                let seed = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(
                        _mm512_setzero_si512(),
                        _mm512_set1_epi8(0x80u8 as i8),
                        signed,
                    ),
                );
                let signed = if xb.is_null() {
                    _mm512_zextsi256_si512(_mm512_castsi512_si256(signed))
                } else {
                    signed
                };
                let seed = if xb.is_null() {
                    _mm512_zextsi256_si512(_mm512_castsi512_si256(seed))
                } else {
                    seed
                };
                panel.x.push(_mm512_castsi512_si256(signed));
                panel.x.push(_mm512_extracti64x4_epi64::<1>(signed));
                panel.seed.push(_mm512_castsi512_si256(seed));
                panel.seed.push(_mm512_extracti64x4_epi64::<1>(seed));
                let (da, db) = (fp16(xa), if xb.is_null() { 0.0 } else { fp16(xb) });
                dx[8 * pair..8 * pair + 4].fill(da);
                dx[8 * pair + 4..8 * pair + 8].fill(db);
                if T == Q4_1 {
                    panel.m.push(fp16(xa.add(2)));
                    panel
                        .m
                        .push(if xb.is_null() { 0.0 } else { fp16(xb.add(2)) });
                } else {
                    panel.m.extend([0.0; 2]);
                }
            }
            panel.dx.push(_mm512_loadu_ps(dx.as_ptr()));
        }
    }
}

/// The f16 scales leading each of `out.len()` blocks of `by` bytes at `row`, as f32 (F16C).
///
/// # Safety
/// F16C is available; `row` holds `out.len()` blocks of `by >= 2` bytes.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn block_scales(row: *const u8, by: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = fp16(row.add(i * by));
    }
}

/// Four activation rows against quad `q` of a filled [`Panel`]: `[token][row]`, the same
/// arithmetic as [`matvec_pre`] per row and token (bit for bit). `dyt` holds the four tokens'
/// block scales as f32, transposed: `dyt[4 * block + c]`.
///
/// One 8-lane accumulator per row and token, as llama.cpp's: per block and pair of them, a
/// `vpdpbusd` from the seed, a convert and an FMA whose scale `dx * dy` comes broadcast from
/// memory (sixteen products made by one 16-lane multiply per block), so the FP pipes do three
/// 256-bit ops per 32 products.
///
/// # Safety
/// As [`panel_fill`]; the panel holds quad `q` of `nb` blocks of `w`; `dyt` has `4 * nb`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn panel_tile(
    w: GgmlType,
    nb: usize,
    panel: &mut Panel,
    q: usize,
    y: [*const u8; 4],
    dyt: *const f32,
) -> [f32; 16] {
    match w {
        GgmlType::Q4_0 => panel_tile_t::<Q4_0>(nb, panel, q, y, dyt),
        GgmlType::Q5_0 => panel_tile_t::<Q5_0>(nb, panel, q, y, dyt),
        GgmlType::Q8_0 => panel_tile_t::<Q8_0>(nb, panel, q, y, dyt),
        _ => panel_tile_t::<Q4_1>(nb, panel, q, y, dyt),
    }
}

/// `acc + broadcast(*d) * v`, the broadcast as the FMA's memory operand (no shuffle, no
/// register: the load ports are idle here, the FP pipes are not).
/// The float at `d[4R + C]` (a constant offset in the instruction, no address arithmetic).
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn fma_bcast<const R: usize, const C: usize>(
    acc: __m256,
    v: __m256,
    d: *const f32,
) -> __m256 {
    let mut r = acc;
    std::arch::asm!(
        "vfmadd231ps {r:y}, {v:y}, dword ptr [{d} + {off}]{{1to8}}",
        r = inout(zmm_reg) r,
        v = in(zmm_reg) v,
        d = in(reg) d,
        off = const 4 * (4 * R + C),
        options(pure, readonly, nostack, preserves_flags)
    );
    r
}

/// Row `r`'s products with token `C`'s activations (`a`) into its accumulator.
#[inline(always)]
unsafe fn quad_step<const C: usize>(
    acc: &mut [[__m256; 4]; 4],
    seed: &[__m256i; 4],
    x: &[__m256i; 4],
    a: __m256i,
    prod: *const f32,
) {
    let s = |r: usize| _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(seed[r], a, x[r]));
    acc[0][C] = fma_bcast::<0, C>(acc[0][C], s(0), prod);
    acc[1][C] = fma_bcast::<1, C>(acc[1][C], s(1), prod);
    acc[2][C] = fma_bcast::<2, C>(acc[2][C], s(2), prod);
    acc[3][C] = fma_bcast::<3, C>(acc[3][C], s(3), prod);
}

#[inline(always)]
unsafe fn panel_tile_t<const T: u8>(
    nb: usize,
    panel: &mut Panel,
    q: usize,
    y: [*const u8; 4],
    dyt: *const f32,
) -> [f32; 16] {
    let (_, by) = block_bytes(T);
    let qoff = if T == Q4_1 { 4 } else { 2 };
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    // Q4_1's m . sy per token and row, `[token][row]` (lane 4c + r, as the reduction's).
    let mut summ = [[0f32; 4]; 4];
    let xs = panel.x.as_ptr().add(q * nb * 4);
    let seeds = panel.seed.as_ptr().add(q * nb * 4);
    let dxs = panel.dx.as_ptr().add(q * nb);
    // All blocks' scale products first (lane 4r + c: row r's scale x token c's), so the FMAs'
    // broadcast loads never wait on a store just made.
    panel.prod.resize(nb, _mm512_setzero_ps());
    for (i, p) in panel.prod.iter_mut().enumerate() {
        *p = _mm512_mul_ps(
            *dxs.add(i),
            _mm512_broadcast_f32x4(_mm_loadu_ps(dyt.add(4 * i))),
        );
    }
    let prods = panel.prod.as_ptr() as *const f32;
    for i in 0..nb {
        let prod = prods.add(16 * i);
        let x = [0, 1, 2, 3].map(|r| *xs.add(4 * i + r));
        let seed = [0, 1, 2, 3].map(|r| *seeds.add(4 * i + r));
        // Activations as the unsigned operand: q + 128.
        let a = |c: usize| {
            _mm256_xor_si256(
                _mm256_loadu_si256(y[c].add(i * by + qoff) as *const __m256i),
                flip,
            )
        };
        quad_step::<0>(&mut acc, &seed, &x, a(0), prod);
        quad_step::<1>(&mut acc, &seed, &x, a(1), prod);
        quad_step::<2>(&mut acc, &seed, &x, a(2), prod);
        quad_step::<3>(&mut acc, &seed, &x, a(3), prod);
        if T == Q4_1 {
            for (c, sc) in summ.iter_mut().enumerate() {
                let sy = fp16(y[c].add(i * by + 2));
                for (r, s) in sc.iter_mut().enumerate() {
                    let m = *panel.m.get_unchecked((q * nb + i) * 4 + r);
                    *s = m.mul_add(sy, *s);
                }
            }
        }
    }
    let sums = hsum8_16(std::array::from_fn(|k| acc[k / 4][k % 4]));
    let mut out = [0f32; 16];
    _mm512_storeu_ps(
        out.as_mut_ptr(),
        _mm512_add_ps(sums, _mm512_loadu_ps(summ.as_ptr() as *const f32)),
    );
    out
}

/// [`hsum8`] of 16 vectors at once, the same additions (so the same bits) in a transposing
/// tree of 29 vector ops: lane `4L + e` of the result is the sum of `v[4e + L]`.
#[inline(always)]
unsafe fn hsum8_16(v: [__m256; 16]) -> __m512 {
    // z[m] = [v[2m], v[2m + 1]]
    let z: [__m512; 8] = std::array::from_fn(|m| {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(v[2 * m])),
            _mm256_castps_pd(v[2 * m + 1]),
        ))
    });
    // hsum8's first step, x[k] + x[k + 4]: 128-bit lane L of s[j] is v[4j + L]'s.
    let s: [__m512; 4] = std::array::from_fn(|j| {
        let (a, b) = (z[2 * j], z[2 * j + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // The second, (0, 1) + (2, 3): lane L of u[i] holds v[8i + L]'s pair, then v[8i + 4 + L]'s.
    let u: [__m512; 2] = std::array::from_fn(|i| {
        let (p, q) = (_mm512_castps_pd(s[2 * i]), _mm512_castps_pd(s[2 * i + 1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(p, q)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)),
        )
    });
    // The last, 0 + 1.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(u[0], u[1]),
        _mm512_shuffle_ps::<0xDD>(u[0], u[1]),
    )
}

/// `vpdpwssd` as written: LLVM otherwise splits the intrinsic into `vpmaddwd + vpaddd` (its
/// tuning for cores where the fused form is slow), one extra vector op per use.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut r = acc;
    std::arch::asm!(
        "vpdpwssd {r}, {a}, {b}",
        r = inout(zmm_reg) r,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

const K4: u8 = 4;
const K6: u8 = 6;

/// `vpshufb` control that fills 128-bit lane `k` with the i16 at index `idx[k]` (of the 8 i16
/// in that lane).
#[inline(always)]
unsafe fn pick16(idx: [i64; 4]) -> __m512i {
    let e = |s: i64| (2 * s) | ((2 * s + 1) << 8);
    let q = |s: i64| e(s) * 0x0001_0001_0001_0001;
    _mm512_set_epi64(
        q(idx[3]),
        q(idx[3]),
        q(idx[2]),
        q(idx[2]),
        q(idx[1]),
        q(idx[1]),
        q(idx[0]),
        q(idx[0]),
    )
}

/// The K-quant tile (`K`: Q4_K or Q6_K against Q8_K): `MR` weight rows x `NR` activation rows,
/// behind both `vec_dot_multi` (`MR = 1`) and `vec_dot_rows`, so the two agree bit for bit.
///
/// Per super-block and pair, four 64-element steps of `vpmaddubsw` (unsigned weight levels
/// x Q8_K quants, never saturating: 2 * 63 * 128 < 2^15) into `vpdpwssd` with the sub-block
/// scales, all into one 16-lane i32 sum; Q6_K's -32 offset seeds that sum as -32 * sc . bsums.
/// Then one convert and FMA by d * yd, and for Q4_K the mins (m . bsums, 4 lanes) by
/// -yd * dmin into the same f32 accumulator. Weight unpacking and scales are shared along a
/// row of the tile, activation gathers along a column.
#[inline(always)]
unsafe fn ktile<const MR: usize, const NR: usize, const K: u8>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
    batched: bool,
) -> [[f32; NR]; MR] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let bx: usize = if K == K4 { 144 } else { 210 };
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    // Q6_K in a matmul of 8 or more tokens: llama.cpp's tiled K-quant kernel, one f32 chain per
    // output: `acc = fma(float(isum) * d, yd, acc)` per super-block.
    let mut chain = [[0f32; NR]; MR];
    // The same chains for a 4 x 4 tile, lane 4c + r.
    let mut chain16 = _mm512_setzero_ps();
    for i in 0..nb {
        // Activation side.
        let mut yd = [0f32; NR];
        let mut q8s = [_mm_setzero_si128(); NR];
        let mut bs = [_mm512_setzero_si512(); NR];
        for c in 0..NR {
            let yb = y[c].add(i * 292);
            yd[c] = (yb as *const f32).read_unaligned();
            let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
            if K == K4 {
                q8s[c] = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bsums),
                    _mm256_extracti128_si256::<1>(bsums),
                );
            } else {
                bs[c] = _mm512_zextsi256_si512(bsums);
            }
        }
        // Weight side: scales broadcast per 128-bit lane, mins, the i32 sums' seeds.
        let mut d = [0f32; MR];
        let mut dmin = [0f32; MR];
        let mut sc_lo = [_mm512_setzero_si512(); MR];
        let mut sc_hi = [_mm512_setzero_si512(); MR];
        let mut mins = [_mm_setzero_si128(); MR];
        let mut sumi = [[_mm512_setzero_si512(); NR]; MR];
        for r in 0..MR {
            let xb = x[r].add(i * bx);
            if K == K4 {
                d[r] = fp16(xb);
                dmin[r] = fp16(xb.add(2));
                let sp = xb.add(4) as *const u32;
                let mut u = [
                    sp.read_unaligned(),
                    sp.add(1).read_unaligned(),
                    sp.add(2).read_unaligned(),
                    0,
                ];
                u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
                let uaux = u[1] & KMASK1;
                u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
                u[2] = uaux;
                u[0] &= KMASK1;
                let ms = _mm256_cvtepu8_epi16(_mm_set_epi32(
                    u[3] as i32,
                    u[2] as i32,
                    u[1] as i32,
                    u[0] as i32,
                ));
                mins[r] = _mm256_extracti128_si256::<1>(ms);
                sc_lo[r] = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ms));
            } else {
                d[r] = fp16(xb.add(208));
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(192) as *const __m128i));
                sc_lo[r] = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16));
                sc_hi[r] = _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16));
                let nsc = _mm512_zextsi256_si512(_mm256_sub_epi16(
                    _mm256_setzero_si256(),
                    _mm256_slli_epi16::<5>(sc16),
                ));
                for c in 0..NR {
                    sumi[r][c] = dpwssd(_mm512_setzero_si512(), nsc, bs[c]);
                }
            }
        }
        for p in 0..4usize {
            let (h, hi) = (p / 2, p % 2 == 1);
            // 64 activation quants matching step p's weight lanes.
            let mut a = [_mm512_setzero_si512(); NR];
            for c in 0..NR {
                let q8 = y[c].add(i * 292 + 4);
                a[c] = if K == K4 {
                    let base = q8.add(128 * h + if hi { 32 } else { 0 });
                    _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_loadu_si256(base as *const __m256i)),
                        _mm256_loadu_si256(base.add(64) as *const __m256i),
                    )
                } else {
                    _mm512_loadu_si512(q8.add(64 * p) as *const _)
                };
            }
            // Scale pick: Q4_K step (h, hi) holds sub-blocks 4h + hi (lanes 0, 1) and
            // 4h + 2 + hi (lanes 2, 3); Q6_K step p holds sub-blocks 4p..4p + 4, one per lane.
            let s = (4 * h + hi as usize) as i64;
            let ctl = if K == K4 {
                pick16([s, s, s + 2, s + 2])
            } else {
                let b = (4 * p % 8) as i64;
                pick16([b, b + 1, b + 2, b + 3])
            };
            for r in 0..MR {
                let xb = x[r].add(i * bx);
                let wq = if K == K4 {
                    let bits = _mm512_loadu_si512(xb.add(16 + 64 * h) as *const _);
                    if hi {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4)
                    } else {
                        _mm512_and_si512(bits, m4)
                    }
                } else {
                    let ql = _mm512_loadu_si512(xb.add(64 * h) as *const _);
                    let lo4 = if hi { _mm512_srli_epi16::<4>(ql) } else { ql };
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        xb.add(128 + 32 * h) as *const __m256i
                    ));
                    // Elements 0..32 of the step take qh bits (0,1) or (4,5), 32..64 bits
                    // (2,3) or (6,7): moved to bits 4, 5 of each byte.
                    let t = if hi {
                        _mm512_srlv_epi16(
                            qh,
                            _mm512_set_epi64(
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0,
                                0,
                                0,
                                0,
                            ),
                        )
                    } else {
                        _mm512_sllv_epi16(
                            qh,
                            _mm512_set_epi64(
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0002_0002_0002_0002,
                                0x0004_0004_0004_0004,
                                0x0004_0004_0004_0004,
                                0x0004_0004_0004_0004,
                                0x0004_0004_0004_0004,
                            ),
                        )
                    };
                    // (lo4 & 0x0f) | (t & 0x30)
                    _mm512_ternarylogic_epi32::<0xEC>(lo4, _mm512_and_si512(t, m30), m4)
                };
                let scv = if K == K4 || p < 2 { sc_lo[r] } else { sc_hi[r] };
                let sc = _mm512_shuffle_epi8(scv, ctl);
                for c in 0..NR {
                    let pr = _mm512_maddubs_epi16(wq, a[c]);
                    sumi[r][c] = dpwssd(sumi[r][c], pr, sc);
                }
            }
        }
        if K == K6 && batched && MR == 4 && NR == 4 {
            // The 16 integer sums at once (lane 4c + r), then the same f32 chain per lane.
            let isum = reduce16(std::array::from_fn(|k| sumi[k / NR][k % NR]));
            let dv = _mm512_broadcast_f32x4(_mm_set_ps(d[3 % MR], d[2 % MR], d[1 % MR], d[0]));
            let ydv = _mm512_permutexvar_ps(
                _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                _mm512_castps128_ps512(_mm_set_ps(yd[3 % NR], yd[2 % NR], yd[1 % NR], yd[0])),
            );
            chain16 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), dv), ydv, chain16);
            continue;
        }
        for r in 0..MR {
            for c in 0..NR {
                if K == K6 && batched {
                    let isum = _mm512_reduce_add_epi32(sumi[r][c]);
                    chain[r][c] = ((isum as f32) * d[r]).mul_add(yd[c], chain[r][c]);
                    continue;
                }
                if K == K6 {
                    // llama.cpp's 8 lanes: lane i gathers elements 4i..4i+3 of every 32, which
                    // are lanes i and i + 8 here (the -32 offset seeded lanes 0..8 as it does).
                    let s = sumi[r][c];
                    let s8 = _mm256_add_epi32(
                        _mm512_castsi512_si256(s),
                        _mm512_extracti64x4_epi64::<1>(s),
                    );
                    let a = _mm256_fmadd_ps(
                        _mm256_set1_ps(d[r] * yd[c]),
                        _mm256_cvtepi32_ps(s8),
                        _mm512_castps512_ps256(acc[r][c]),
                    );
                    acc[r][c] = _mm512_zextps256_ps512(a);
                    continue;
                }
                acc[r][c] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(sumi[r][c]),
                    _mm512_set1_ps(d[r] * yd[c]),
                    acc[r][c],
                );
                if K == K4 {
                    let m = _mm_cvtepi32_ps(_mm_madd_epi16(mins[r], q8s[c]));
                    acc[r][c] = _mm512_fmadd_ps(
                        _mm512_zextps128_ps512(m),
                        _mm512_set1_ps(-yd[c] * dmin[r]),
                        acc[r][c],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; NR]; MR];
    let mut lanes16 = [0f32; 16];
    _mm512_storeu_ps(lanes16.as_mut_ptr(), chain16);
    for r in 0..MR {
        for c in 0..NR {
            out[r][c] = if K == K6 && batched && MR == 4 && NR == 4 {
                lanes16[4 * c + r]
            } else if K == K6 && batched {
                chain[r][c]
            } else if K == K6 {
                hsum8(_mm512_castps512_ps256(acc[r][c]))
            } else {
                _mm512_reduce_add_ps(acc[r][c])
            };
        }
    }
    out
}

/// Horizontal sums of 16 vectors in one: lane `4k + j` of the result is the sum of `v[4j + k]`
/// (a transposing tree, 45 vector ops instead of 16 separate reductions of ~9 each).
#[inline(always)]
unsafe fn reduce16(v: [__m512i; 16]) -> __m512i {
    // Pairs: 128-bit lanes 0, 1 carry v[2m]'s halves summed, lanes 2, 3 v[2m + 1]'s.
    let w: [__m512i; 8] = std::array::from_fn(|m| {
        let (a, b) = (v[2 * m], v[2 * m + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x44>(a, b),
            _mm512_shuffle_i64x2::<0xEE>(a, b),
        )
    });
    // Quads: 128-bit lane k carries v[4m + k]'s four partial sums.
    let x: [__m512i; 4] = std::array::from_fn(|m| {
        let (a, b) = (w[2 * m], w[2 * m + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x88>(a, b),
            _mm512_shuffle_i64x2::<0xDD>(a, b),
        )
    });
    let y: [__m512i; 2] = std::array::from_fn(|m| {
        let (a, b) = (x[2 * m], x[2 * m + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    });
    _mm512_add_epi32(
        _mm512_unpacklo_epi64(y[0], y[1]),
        _mm512_unpackhi_epi64(y[0], y[1]),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ktile_q4k<const MR: usize, const NR: usize>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
) -> [[f32; NR]; MR] {
    ktile::<MR, NR, K4>(nb, x, y, false)
}

/// Decode over `out.len()` consecutive K-quant rows (`row_bytes` apart from `x`) against one
/// activation row: the one-row kernel ([`ktile`], so the same bits as [`dot512`]) inlined into
/// the row loop, its constants and the call set up once per matvec instead of once per row.
///
/// # Safety
/// AVX-512 VNNI is available; `w` is Q4_K or Q6_K; `x` holds `out.len()` rows of `nb` blocks;
/// `y` holds `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn matvec_k(
    w: GgmlType,
    nb: usize,
    x: *const u8,
    row_bytes: usize,
    y: *const u8,
    out: &mut [f32],
) {
    if w == GgmlType::Q4_K {
        for (r, o) in out.iter_mut().enumerate() {
            *o = ktile::<1, 1, K4>(nb, [x.add(r * row_bytes)], [y], false)[0][0];
        }
    } else {
        for (r, o) in out.iter_mut().enumerate() {
            *o = ktile::<1, 1, K6>(nb, [x.add(r * row_bytes)], [y], false)[0][0];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ktile_q6k<const MR: usize, const NR: usize>(
    nb: usize,
    x: [*const u8; MR],
    y: [*const u8; NR],
    batched: bool,
) -> [[f32; NR]; MR] {
    ktile::<MR, NR, K6>(nb, x, y, batched)
}
