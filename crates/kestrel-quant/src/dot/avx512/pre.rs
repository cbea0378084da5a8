//! Decode over the 32-element block types: the activation row prepared once per matvec
//! ([`PreAct`]), then each weight row's pass does only its own work.

use super::*;

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
/// AVX-512 VNNI is available; `w` is a [`has_panel`](crate::dot::q32::has_panel) type; `y` holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn preact_fill(w: GgmlType, nb: usize, y: *const u8, pre: &mut PreAct) {
    let t = match w {
        GgmlType::Q4_0 => Q4_0,
        GgmlType::Q5_0 => Q5_0,
        GgmlType::Q8_0 => Q8_0,
        GgmlType::Q5_1 => Q5_1,
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
        let q = if with_min(t) {
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
        if with_min(t) {
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
        GgmlType::Q5_1 => matvec_pre_t::<Q5_1>(nb, x, row_bytes, pre, out),
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
            if with_min(T) {
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
        GgmlType::Q5_1 => multi_pre_t::<N, Q5_1>(nb, x, row_bytes, rows, pre, out),
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
            let m = if with_min(T) {
                [fp16(xa.add(2)), if two { fp16(xb.add(2)) } else { 0.0 }]
            } else {
                [0.0; 2]
            };
            for c in 0..N {
                let p = pre.get_unchecked(c);
                if with_min(T) {
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
