//! Quantizers: f32 rows into blocks.
//!
//! Activation quantizers (Q8_0, Q8_1, Q8_K) reproduce llama.cpp's `quantize_row_q8_*_ref`
//! exactly: the matmul path quantizes each activation row once and dots it against every weight
//! row, so equal activation bytes are the first condition for equal greedy tokens. The weight
//! quantizers are llama.cpp's `_ref` (no importance matrix) versions: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0
//! are bit-exact with the `gguf` Python package; Q4_K and Q6_K follow `make_qkx2_quants` /
//! `make_qx_quants` operation by operation.

use crate::blocks::*;
use crate::float16::{f32_to_bf16, f32_to_f16, F16};
use crate::QuantError;
use kestrel_gguf::GgmlType;

/// Below this, a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Quantize `src` (one row, a whole number of blocks) into `dst` (exactly the row's bytes).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_row(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => blocks(src, dst, q4_0),
        GgmlType::Q4_1 => blocks(src, dst, q4_1),
        GgmlType::Q5_0 => blocks(src, dst, q5_0),
        GgmlType::Q5_1 => blocks(src, dst, q5_1),
        GgmlType::Q8_0 => blocks(src, dst, q8_0),
        GgmlType::Q8_1 => blocks(src, dst, q8_1),
        GgmlType::Q4_K => blocks(src, dst, q4_k),
        GgmlType::Q5_K => blocks(src, dst, q5_k),
        GgmlType::Q6_K => blocks(src, dst, q6_k),
        GgmlType::Q8_K => q8_k_row(src, dst),
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: "quantize_row",
            })
        }
    }
    Ok(())
}

/// Quantize one activation row as llama.cpp's x86 CPU backend does before a matmul (and before
/// writing a q8_0 KV cache): its AVX `quantize_row_q8_0` / `quantize_row_q8_1` take the inverse
/// scale as `127 / amax` (not `1 / d`) and round half to even (not away from zero), so they differ
/// from the `_ref` quantizers in the last bit of some quants. Q8_K has no SIMD variant there and
/// every other type is quantized as [`quantize_row`] does.
pub fn quantize_activation_row(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    match ty {
        GgmlType::Q8_0 => {
            check_row(ty, src.len(), dst.len())?;
            blocks(src, dst, |x| {
                let (d, qs, _) = q8_x86(x);
                BlockQ8_0 {
                    d: F16::from_f32(d),
                    qs,
                }
            });
            Ok(())
        }
        GgmlType::Q8_1 => {
            check_row(ty, src.len(), dst.len())?;
            blocks(src, dst, |x| {
                let (d, qs, sum) = q8_x86(x);
                BlockQ8_1 {
                    d: F16::from_f32(d),
                    s: F16::from_f32(d * sum as f32),
                    qs,
                }
            });
            Ok(())
        }
        _ => quantize_row(ty, src, dst),
    }
}

/// The shared core of the x86 Q8_0/Q8_1 quantizers: `(d, quants, sum of quants)`.
#[inline(always)]
fn q8_x86(x: &[f32]) -> (f32, [i8; 32], i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (o, &v) in qs.iter_mut().zip(x) {
        // Round half to even (as `_mm256_round_ps(_MM_ROUND_NEAREST)`), without a libm call.
        *o = nearest_int(v * id) as i8;
        sum += *o as i32;
    }
    (d, qs, sum)
}

#[inline(always)]
fn blocks<B: Block>(src: &[f32], dst: &mut [u8], f: fn(&[f32]) -> B) {
    for (x, y) in src.chunks_exact(B::LEN).zip(dst.chunks_exact_mut(B::BYTES)) {
        write_block(&f(x), y);
    }
}

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (valid for |x| < 2^22).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The value of largest magnitude (first one on ties), as ggml's `if (amax < fabsf(v))` loops.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

fn q4_0(x: &[f32]) -> BlockQ4_0 {
    let (_, max) = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let x0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let x1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        qs[j] = x0 | (x1 << 4);
    }
    BlockQ4_0 {
        d: F16::from_f32(d),
        qs,
    }
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn q4_1(x: &[f32]) -> BlockQ4_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let x0 = (((x[j] - min) * id + 0.5) as u8).min(15);
        let x1 = (((x[j + 16] - min) * id + 0.5) as u8).min(15);
        qs[j] = x0 | (x1 << 4);
    }
    BlockQ4_1 {
        d: F16::from_f32(d),
        m: F16::from_f32(min),
        qs,
    }
}

/// Pack 32 five-bit values as ggml does: low nibbles in `qs`, bit 4 of value j at bit j of `qh`.
fn pack5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0xf) | ((q[j + 16] & 0xf) << 4);
        qh |= (((q[j] & 0x10) >> 4) as u32) << j;
        qh |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

fn q5_0(x: &[f32]) -> BlockQ5_0 {
    let (_, max) = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (o, &v) in q.iter_mut().zip(x) {
        *o = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let (qh, qs) = pack5(&q);
    BlockQ5_0 {
        d: F16::from_f32(d),
        qh,
        qs,
    }
}

fn q5_1(x: &[f32]) -> BlockQ5_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (((v - min) * id + 0.5) as u8).min(31);
    }
    let (qh, qs) = pack5(&q);
    BlockQ5_1 {
        d: F16::from_f32(d),
        m: F16::from_f32(min),
        qh,
        qs,
    }
}

/// `quantize_row_q8_0_ref`: d = amax / 127, q = roundf(x / d) (half away from zero).
fn q8_0(x: &[f32]) -> BlockQ8_0 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (o, &v) in qs.iter_mut().zip(x) {
        *o = (v * id).round() as i8;
    }
    BlockQ8_0 {
        d: F16::from_f32(d),
        qs,
    }
}

/// `quantize_row_q8_1_ref`: Q8_0 plus s = d * sum(q) (the sum in int, times d in f32).
fn q8_1(x: &[f32]) -> BlockQ8_1 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (o, &v) in qs.iter_mut().zip(x) {
        *o = (v * id).round() as i8;
        sum += *o as i32;
    }
    BlockQ8_1 {
        d: F16::from_f32(d),
        s: F16::from_f32(sum as f32 * d),
        qs,
    }
}

/// `quantize_row_q8_K_ref`: scale from the signed max, q = min(127, nearest_int(-127/max * x)),
/// d = 1 / iscale, plus the sums of each 16 quants. (An all-zero block gets zero bsums too;
/// llama.cpp leaves them unwritten.)
fn q8_k(x: &[f32]) -> BlockQ8K {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut y = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
    if amax == 0.0 {
        return y;
    }
    let iscale = -127.0 / max;
    for (o, &v) in y.qs.iter_mut().zip(x) {
        *o = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
    y.d = 1.0 / iscale;
    y
}

/// Q8_K blocks of a row: [`q8_k`]'s bits, with AVX-512 where the CPU has it (decode quantizes
/// every K-quant matmul's input this way on one thread while the memory bus idles: 9.7 us for
/// 8,960 values in scalar code on the AMD VM).
fn q8_k_row(src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if q8k_simd::available() {
        for (x, y) in src
            .chunks_exact(QK_K)
            .zip(dst.chunks_exact_mut(Q8K_BLOCK_BYTES))
        {
            // SAFETY: AVX-512 F/BW are available; `x` holds 256 values and `y` 292 bytes.
            unsafe { q8k_simd::block(x, y) };
        }
        return;
    }
    blocks(src, dst, q8_k)
}

/// Bytes of a Q8_K block: `d` f32, 256 `qs` i8, 16 `bsums` i16.
const Q8K_BLOCK_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);

#[cfg(target_arch = "x86_64")]
mod q8k_simd {
    use super::QK_K;
    use std::arch::x86_64::*;

    pub(super) fn available() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
        })
    }

    /// [`super::q8_k`] of `x` (256 values) written as its bytes to `y`, with the same float
    /// operations per element: the same bits.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn block(x: &[f32], y: &mut [u8]) {
        debug_assert!(x.len() == QK_K && y.len() == super::Q8K_BLOCK_BYTES);
        let p = x.as_ptr();
        // amax: `max_ps(|v|, acc)` keeps `acc` where |v| is NaN, as the scalar `>` skips it.
        let mut acc = _mm512_setzero_ps();
        for c in 0..QK_K / 16 {
            acc = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(p.add(16 * c))), acc);
        }
        let amax = _mm512_reduce_max_ps(acc);
        y.fill(0);
        if amax == 0.0 || amax.is_nan() {
            // The scalar form returns the zero block when no |v| exceeds 0.
            return;
        }
        // max: the first value whose magnitude is amax (the scalar loop's strict `>`).
        let target = _mm512_set1_ps(amax);
        let mut max = 0f32;
        for c in 0..QK_K / 16 {
            let v = _mm512_loadu_ps(p.add(16 * c));
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), target);
            if hit != 0 {
                max = x[16 * c + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let (vs, magic) = (_mm512_set1_ps(iscale), _mm512_set1_ps(12582912.0));
        let (mant, bias, top) = (
            _mm512_set1_epi32(0x007f_ffff),
            _mm512_set1_epi32(0x0040_0000),
            _mm512_set1_epi32(127),
        );
        let q = y.as_mut_ptr().add(4);
        let bsums = y.as_mut_ptr().add(4 + QK_K) as *mut i16;
        for c in 0..QK_K / 16 {
            // nearest_int(iscale * v).min(127)
            let t = _mm512_add_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(p.add(16 * c))), magic);
            let i = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(t), mant), bias);
            let i = _mm512_min_epi32(i, top);
            _mm_storeu_si128(q.add(16 * c) as *mut __m128i, _mm512_cvtepi32_epi8(i));
            // The sum of the stored bytes (`as i8`), as the scalar form sums them.
            let stored = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(i));
            bsums
                .add(c)
                .write_unaligned(_mm512_reduce_add_epi32(stored) as i16);
        }
        y[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// ggml's `make_qkx2_quants`: a scale and a min for one group, by trying `nstep + 1` grids and
/// solving weighted least squares for each. Returns (scale, -min); `l` gets the levels.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = li as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = li as u8;
            let w = weights[i];
            let lf = li as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (w = x^2): a signed
/// scale for one group, searching 19 grids around `nmax / max`. `l` gets levels biased by nmax.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let lf = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (o, &v) in l.iter_mut().zip(x) {
        *o = (level(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l.iter_mut().zip(x) {
                *o = (level(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The shared half of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: per group of 32 a
/// scale and a min by [`make_qkx2_quants`] (levels `0..=nmax`), both quantized to 6 bits
/// against the block's `d` / `dmin`, and every element's level under the quantized scales.
/// Returns (d, dmin, packed scales, levels).
fn k_scales_mins(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> (F16, F16, [u8; K_SCALE_SIZE], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |a, v| a + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (
        F16::from_f32(max_scale / 63.0),
        F16::from_f32(max_min / 63.0),
    );
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

/// `quantize_row_q4_K_ref`.
fn q4_k(x: &[f32]) -> BlockQ4K {
    let (d, dmin, scales, l) = k_scales_mins(x, 15, -1.0, 20);
    let mut y = BlockQ4K {
        d,
        dmin,
        scales,
        qs: [0; QK_K / 2],
    };
    for g in 0..4 {
        for k in 0..32 {
            y.qs[32 * g + k] = l[64 * g + k] | (l[64 * g + k + 32] << 4);
        }
    }
    y
}

/// `quantize_row_q5_K_ref`: Q4_K's scales with 5-bit levels, the fifth bit in `qh`.
fn q5_k(x: &[f32]) -> BlockQ5K {
    let (d, dmin, scales, l) = k_scales_mins(x, 31, -0.5, 15);
    let mut y = BlockQ5K {
        d,
        dmin,
        scales,
        qh: [0; QK_K / 8],
        qs: [0; QK_K / 2],
    };
    // 64 elements per pass: low nibbles of the first 32, high nibbles of the next 32; their
    // fifth bits at bits 2p and 2p + 1 of qh for pass p
    for p in 0..4 {
        for j in 0..32 {
            let (l1, l2) = (l[64 * p + j], l[64 * p + j + 32]);
            y.qh[j] |= ((l1 >> 4) << (2 * p)) | ((l2 >> 4) << (2 * p + 1));
            y.qs[32 * p + j] = (l1 & 15) | ((l2 & 15) << 4);
        }
    }
    y
}

/// `quantize_row_q6_K_ref`.
#[allow(clippy::needless_range_loop)]
fn q6_k(x: &[f32]) -> BlockQ6K {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    let mut y = BlockQ6K {
        ql: [0; QK_K / 2],
        qh: [0; QK_K / 4],
        scales: [0; 16],
        d: F16::ZERO,
    };
    if max_abs_scale < GROUP_MAX_EPS {
        return y;
    }
    let iscale = -128.0 / max_scale;
    y.d = F16::from_f32(1.0 / iscale);
    for ib in 0..16 {
        y.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    let d = y.d.to_f32();
    for j in 0..16 {
        let dj = d * y.scales[j] as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    for half in 0..2 {
        let l = &l[128 * half..128 * half + 128];
        for k in 0..32 {
            let q = |o: usize| l[k + o] as u8;
            y.ql[64 * half + k] = (q(0) & 0xf) | ((q(64) & 0xf) << 4);
            y.ql[64 * half + k + 32] = (q(32) & 0xf) | ((q(96) & 0xf) << 4);
            y.qh[32 * half + k] =
                (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
    y
}

#[cfg(test)]
mod tests {

    /// The AVX-512 Q8_K quantizer against the scalar one, bit for bit: random rows, ties of
    /// magnitude with either sign first, zeros, infinities and NaNs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q8_k_simd_equals_scalar() {
        if !super::q8k_simd::available() {
            return;
        }
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-30f32, 1e-3, 1.0, 7.5, 1e4] {
            rows.push((0..QK_K).map(|_| rnd() * scale).collect());
        }
        let mut tie = vec![0.5f32; QK_K];
        tie[17] = -3.0;
        tie[200] = 3.0;
        rows.push(tie.clone());
        tie[17] = 3.0;
        tie[200] = -3.0;
        rows.push(tie);
        rows.push(vec![0.0; QK_K]);
        rows.push(vec![-0.0; QK_K]);
        let mut odd: Vec<f32> = (0..QK_K).map(|_| rnd()).collect();
        odd[3] = f32::NAN;
        rows.push(odd.clone());
        odd[100] = f32::INFINITY;
        rows.push(odd);
        rows.push(vec![f32::NAN; QK_K]);
        // Values that round to exactly +-127.5 / half-way levels.
        rows.push((0..QK_K).map(|i| (i as f32 - 128.0) * 0.5).collect());
        for (n, x) in rows.iter().enumerate() {
            let mut want = vec![0u8; Q8K_BLOCK_BYTES];
            write_block(&q8_k(x), &mut want);
            let mut got = vec![0u8; Q8K_BLOCK_BYTES];
            // SAFETY: checked available above; sizes match.
            unsafe { super::q8k_simd::block(x, &mut got) };
            assert_eq!(got, want, "row {n}");
        }
    }
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(126.9), 127);
    }

    /// K-quants round-trip a row within their precision, and more bits do better.
    #[test]
    fn k_quants_round_trip_within_their_precision() {
        let mut seed = 0x9E3779B97F4A7C15u64;
        let x: Vec<f32> = (0..4 * QK_K)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let u = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                u * if i % 97 == 0 { 8.0 } else { 1.0 } // a few outliers
            })
            .collect();
        let rms = |v: &[f32]| (v.iter().map(|a| a * a).sum::<f32>() / v.len() as f32).sqrt();
        let mut errs = Vec::new();
        for (ty, bound) in [
            (GgmlType::Q4_K, 0.12),
            (GgmlType::Q5_K, 0.06),
            (GgmlType::Q6_K, 0.03),
        ] {
            let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
            quantize_row(ty, &x, &mut q).unwrap();
            let mut back = vec![0f32; x.len()];
            crate::dequantize_row(ty, &q, &mut back).unwrap();
            let diff: Vec<f32> = x.iter().zip(&back).map(|(a, b)| a - b).collect();
            let rel = rms(&diff) / rms(&x);
            assert!(rel < bound, "{ty}: relative RMS error {rel} >= {bound}");
            errs.push(rel);
        }
        assert!(errs[0] > errs[1] && errs[1] > errs[2], "{errs:?}");
    }

    #[test]
    fn zero_rows_quantize_to_zero() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q8_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let n = ty.block_len() as usize;
            let mut dst = vec![0xaau8; ty.block_bytes() as usize];
            quantize_row(ty, &vec![0.0; n], &mut dst).unwrap();
            let mut back = vec![1.0; n];
            crate::dequantize_row(ty, &dst, &mut back).unwrap_or(());
            if ty != GgmlType::Q8_K {
                assert!(back.iter().all(|&v| v == 0.0), "{ty}");
            }
        }
    }
}

#[cfg(test)]
mod x86_activation_tests {
    use super::*;

    #[test]
    fn activation_quantizer_rounds_half_to_even_with_127_over_amax() {
        // amax 127 gives id = 1 exactly: every x.5 is a tie.
        let mut x = [0f32; 32];
        x[..6].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -2.5]);
        let mut act = [0u8; 34];
        quantize_activation_row(GgmlType::Q8_0, &x, &mut act).unwrap();
        let q: Vec<i8> = act[2..8].iter().map(|&b| b as i8).collect();
        assert_eq!(q, [127, 0, 2, 2, 0, -2]);
        // The `_ref` quantizer rounds the same ties away from zero.
        let mut reference = [0u8; 34];
        quantize_row(GgmlType::Q8_0, &x, &mut reference).unwrap();
        let q: Vec<i8> = reference[2..8].iter().map(|&b| b as i8).collect();
        assert_eq!(q, [127, 1, 2, 3, -1, -3]);
        // Q8_1 carries s = d * sum(q) with the same quants.
        let mut act1 = [0u8; 36];
        quantize_activation_row(GgmlType::Q8_1, &x, &mut act1).unwrap();
        assert_eq!(&act1[4..], &act[2..]);
        let s = crate::float16::f16_to_f32(u16::from_le_bytes([act1[2], act1[3]]));
        assert_eq!(s, 129.0);
    }
}
