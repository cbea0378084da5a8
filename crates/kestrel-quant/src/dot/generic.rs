//! Scalar reference dot products, one per (weight, activation) pair: the oracle every SIMD
//! kernel is tested against. Integer sums per block exactly as ggml's `*_generic` kernels,
//! then one f32 multiply-add per block (or per super-block) in row order.

use crate::blocks::*;
use crate::float16::{bf16_to_f32, f16_to_f32};
use kestrel_gguf::GgmlType;

/// Dot of one weight row against one activation row (both already length-checked: `x` holds
/// `n` elements of `w`, `y` holds `n` of `vec_dot_type(w)`).
pub fn vec_dot(w: GgmlType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    match w {
        GgmlType::F32 => f32_f32(n, x, y),
        GgmlType::F16 => half_f32(n, x, y, f16_to_f32),
        GgmlType::BF16 => half_f32(n, x, y, bf16_to_f32),
        GgmlType::Q4_0 => pairs(x, y, q4_0_q8_0),
        GgmlType::Q4_1 => pairs(x, y, q4_1_q8_1),
        GgmlType::Q5_0 => pairs(x, y, q5_0_q8_0),
        GgmlType::Q5_1 => pairs(x, y, q5_1_q8_1),
        GgmlType::Q8_0 => pairs(x, y, q8_0_q8_0),
        GgmlType::Q2_K => pairs(x, y, q2_k_q8_k),
        GgmlType::Q3_K => pairs(x, y, q3_k_q8_k),
        GgmlType::Q4_K => pairs(x, y, q4_k_q8_k),
        GgmlType::Q5_K => pairs(x, y, q5_k_q8_k),
        GgmlType::Q6_K => pairs(x, y, q6_k_q8_k),
        // vec_dot_type() refuses the rest before we get here.
        _ => 0.0,
    }
}

/// Sixteen running sums (as ggml's SIMD F32 dot keeps several), so the loop vectorizes on
/// any x86-64 and a row of F32 weights (a MoE router, the tiny test models) streams at memory
/// speed rather than one dependent add per element.
fn f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let (x, y) = (&x[..4 * n], &y[..4 * n]);
    let mut acc = [0f32; 16];
    let (xs, ys) = (x.chunks_exact(64), y.chunks_exact(64));
    let (xr, yr) = (xs.remainder(), ys.remainder());
    for (a, b) in xs.zip(ys) {
        for i in 0..16 {
            acc[i] += f(&a[4 * i..]) * f(&b[4 * i..]);
        }
    }
    let mut tail = 0f32;
    for (a, b) in xr.chunks_exact(4).zip(yr.chunks_exact(4)) {
        tail += f(a) * f(b);
    }
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + tail
}

fn half_f32(n: usize, x: &[u8], y: &[u8], cvt: fn(u16) -> f32) -> f32 {
    let mut sum = 0f32;
    for (a, b) in x.chunks_exact(2).zip(y.chunks_exact(4)).take(n) {
        let a = cvt(u16::from_le_bytes([a[0], a[1]]));
        let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        sum += a * b;
    }
    sum
}

/// Sum `f` over the block pairs of two rows.
#[inline(always)]
fn pairs<X: Block, Y: Block>(x: &[u8], y: &[u8], f: fn(&X, &Y) -> f32) -> f32 {
    let mut sum = 0f32;
    for (a, b) in x.chunks_exact(X::BYTES).zip(y.chunks_exact(Y::BYTES)) {
        sum += f(&read_block(a), &read_block(b));
    }
    sum
}

fn q4_0_q8_0(x: &BlockQ4_0, y: &BlockQ8_0) -> f32 {
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi += ((x.qs[j] & 0xf) as i32 - 8) * y.qs[j] as i32;
        sumi += ((x.qs[j] >> 4) as i32 - 8) * y.qs[j + 16] as i32;
    }
    sumi as f32 * (x.d.to_f32() * y.d.to_f32())
}

fn q4_1_q8_1(x: &BlockQ4_1, y: &BlockQ8_1) -> f32 {
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi += (x.qs[j] & 0xf) as i32 * y.qs[j] as i32;
        sumi += (x.qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
    }
    (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32()
}

fn q5_0_q8_0(x: &BlockQ5_0, y: &BlockQ8_0) -> f32 {
    let qh = u32::from_le_bytes(x.qh);
    let mut sumi = 0i32;
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        sumi += (((x.qs[j] & 0xf) as u32 | h0) as i32 - 16) * y.qs[j] as i32;
        sumi += (((x.qs[j] >> 4) as u32 | h1) as i32 - 16) * y.qs[j + 16] as i32;
    }
    sumi as f32 * (x.d.to_f32() * y.d.to_f32())
}

fn q5_1_q8_1(x: &BlockQ5_1, y: &BlockQ8_1) -> f32 {
    let qh = u32::from_le_bytes(x.qh);
    let mut sumi = 0i32;
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        sumi += ((x.qs[j] & 0xf) as u32 | h0) as i32 * y.qs[j] as i32;
        sumi += ((x.qs[j] >> 4) as u32 | h1) as i32 * y.qs[j + 16] as i32;
    }
    (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32()
}

fn q8_0_q8_0(x: &BlockQ8_0, y: &BlockQ8_0) -> f32 {
    let sumi: i32 =
        x.qs.iter()
            .zip(&y.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
    sumi as f32 * (x.d.to_f32() * y.d.to_f32())
}

/// Sum of `q[i] * y[i]` over 16 elements starting at `at`.
#[inline(always)]
fn isum16(q: &[i8; QK_K], y: &[i8; QK_K], at: usize) -> i32 {
    (at..at + 16).map(|i| q[i] as i32 * y[i] as i32).sum()
}

fn q2_k_q8_k(x: &BlockQ2K, y: &BlockQ8K) -> f32 {
    // Unpack the 2-bit levels into element order, then one scale per 16.
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        for (k, shift) in [0, 2, 4, 6].into_iter().enumerate() {
            for l in 0..32 {
                q[128 * half + 32 * k + l] = ((x.qs[32 * half + l] >> shift) & 3) as i8;
            }
        }
    }
    let (mut isum, mut summs) = (0i32, 0i32);
    for j in 0..16 {
        isum += (x.scales[j] & 0xf) as i32 * isum16(&q, &y.qs, 16 * j);
        summs += (x.scales[j] >> 4) as i32 * y.bsums[j] as i32;
    }
    let dall = y.d * x.d.to_f32();
    let dmin = y.d * x.dmin.to_f32();
    dall * isum as f32 - dmin * summs as f32
}

fn q3_k_q8_k(x: &BlockQ3K, y: &BlockQ8K) -> f32 {
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        for (k, shift) in [0, 2, 4, 6].into_iter().enumerate() {
            let m = 1u8 << (4 * half + k);
            for l in 0..32 {
                let low = ((x.qs[32 * half + l] >> shift) & 3) as i8;
                let sub = if x.hmask[l] & m != 0 { 0 } else { 4 };
                q[128 * half + 32 * k + l] = low - sub;
            }
        }
    }
    let scales = q3k_scales(&x.scales);
    let mut isum = 0i32;
    for (j, &sc) in scales.iter().enumerate() {
        isum += (sc as i32 - 32) * isum16(&q, &y.qs, 16 * j);
    }
    x.d.to_f32() * y.d * isum as f32
}

/// Shared by Q4_K and Q5_K: levels `q` (0..31), 8 (scale, min) pairs per 32 elements.
fn kx_q8_k(q: &[i8; QK_K], d: f32, dmin: f32, scales: &[u8; K_SCALE_SIZE], y: &BlockQ8K) -> f32 {
    let (mut isum, mut summs) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        isum += sc as i32 * (isum16(q, &y.qs, 32 * j) + isum16(q, &y.qs, 32 * j + 16));
        summs += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    (y.d * d) * isum as f32 - (y.d * dmin) * summs as f32
}

fn q4_k_q8_k(x: &BlockQ4K, y: &BlockQ8K) -> f32 {
    let mut q = [0i8; QK_K];
    for g in 0..4 {
        for l in 0..32 {
            q[64 * g + l] = (x.qs[32 * g + l] & 0xf) as i8;
            q[64 * g + l + 32] = (x.qs[32 * g + l] >> 4) as i8;
        }
    }
    kx_q8_k(&q, x.d.to_f32(), x.dmin.to_f32(), &x.scales, y)
}

fn q5_k_q8_k(x: &BlockQ5K, y: &BlockQ8K) -> f32 {
    let mut q = [0i8; QK_K];
    for g in 0..4 {
        for l in 0..32 {
            let h1 = ((x.qh[l] >> (2 * g)) & 1) << 4;
            let h2 = ((x.qh[l] >> (2 * g + 1)) & 1) << 4;
            q[64 * g + l] = ((x.qs[32 * g + l] & 0xf) | h1) as i8;
            q[64 * g + l + 32] = ((x.qs[32 * g + l] >> 4) | h2) as i8;
        }
    }
    kx_q8_k(&q, x.d.to_f32(), x.dmin.to_f32(), &x.scales, y)
}

fn q6_k_q8_k(x: &BlockQ6K, y: &BlockQ8K) -> f32 {
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (&x.ql[64 * half..], &x.qh[32 * half..]);
        let q = &mut q[128 * half..];
        for l in 0..32 {
            q[l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
            q[l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    let mut isum = 0i32;
    for j in 0..16 {
        isum += x.scales[j] as i32 * isum16(&q, &y.qs, 16 * j);
    }
    x.d.to_f32() * y.d * isum as f32
}
