//! Reference dequantization: one block type at a time, in the exact float operation order of
//! llama.cpp's `dequantize_row_*` (ggml-quants.c), so results are bit-exact with it (and with the
//! `gguf` Python package, which evaluates the same products). No fused multiply-adds here: Rust
//! never contracts `a * b - c`, matching a non-FMA C build.

use crate::blocks::*;
use crate::float16::{bf16_to_f32, f16_to_f32};
use crate::QuantError;
use kestrel_gguf::GgmlType;

/// Dequantize one row: `src` holds the blocks of `dst.len()` elements of type `ty`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_row(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::Q4_0 => blocks(src, dst, q4_0),
        GgmlType::Q4_1 => blocks(src, dst, q4_1),
        GgmlType::Q5_0 => blocks(src, dst, q5_0),
        GgmlType::Q5_1 => blocks(src, dst, q5_1),
        GgmlType::Q8_0 => blocks(src, dst, q8_0),
        GgmlType::Q8_1 => blocks(src, dst, q8_1),
        GgmlType::Q2_K => blocks(src, dst, q2_k),
        GgmlType::Q3_K => blocks(src, dst, q3_k),
        GgmlType::Q4_K => blocks(src, dst, q4_k),
        GgmlType::Q5_K => blocks(src, dst, q5_k),
        GgmlType::Q6_K => blocks(src, dst, q6_k),
        GgmlType::Q8_K => blocks(src, dst, q8_k),
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: "dequantize_row",
            })
        }
    }
    Ok(())
}

/// Walk the row block by block (lengths already checked by the caller).
#[inline(always)]
fn blocks<B: Block>(src: &[u8], dst: &mut [f32], f: fn(&B, &mut [f32])) {
    for (b, y) in src.chunks_exact(B::BYTES).zip(dst.chunks_exact_mut(B::LEN)) {
        f(&read_block::<B>(b), y);
    }
}

fn q4_0(x: &BlockQ4_0, y: &mut [f32]) {
    let d = x.d.to_f32();
    for j in 0..16 {
        let x0 = (x.qs[j] & 0xf) as i32 - 8;
        let x1 = (x.qs[j] >> 4) as i32 - 8;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

fn q4_1(x: &BlockQ4_1, y: &mut [f32]) {
    let (d, m) = (x.d.to_f32(), x.m.to_f32());
    for j in 0..16 {
        y[j] = (x.qs[j] & 0xf) as f32 * d + m;
        y[j + 16] = (x.qs[j] >> 4) as f32 * d + m;
    }
}

fn q5_0(x: &BlockQ5_0, y: &mut [f32]) {
    let d = x.d.to_f32();
    let qh = u32::from_le_bytes(x.qh);
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = (((x.qs[j] & 0xf) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((x.qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(x: &BlockQ5_1, y: &mut [f32]) {
    let (d, m) = (x.d.to_f32(), x.m.to_f32());
    let qh = u32::from_le_bytes(x.qh);
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = ((x.qs[j] & 0xf) | h0) as f32 * d + m;
        y[j + 16] = ((x.qs[j] >> 4) | h1) as f32 * d + m;
    }
}

fn q8_0(x: &BlockQ8_0, y: &mut [f32]) {
    let d = x.d.to_f32();
    for (o, &q) in y.iter_mut().zip(&x.qs) {
        *o = q as f32 * d;
    }
}

fn q8_1(x: &BlockQ8_1, y: &mut [f32]) {
    let d = x.d.to_f32();
    for (o, &q) in y.iter_mut().zip(&x.qs) {
        *o = q as f32 * d;
    }
}

fn q8_k(x: &BlockQ8K, y: &mut [f32]) {
    for (o, &q) in y.iter_mut().zip(&x.qs) {
        *o = x.d * q as f32;
    }
}

fn q2_k(x: &BlockQ2K, y: &mut [f32]) {
    let (d, min) = (x.d.to_f32(), x.dmin.to_f32());
    let mut is = 0;
    let mut out = 0;
    for half in 0..2 {
        let q = &x.qs[32 * half..32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = x.scales[is];
                is += 1;
                let dl = d * (sc & 0xf) as f32;
                let ml = min * (sc >> 4) as f32;
                for &b in &q[16 * part..16 * part + 16] {
                    y[out] = dl * ((b >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

#[allow(clippy::needless_range_loop)]
fn q3_k(x: &BlockQ3K, y: &mut [f32]) {
    let d_all = x.d.to_f32();
    let scales = q3k_scales(&x.scales);
    let mut is = 0;
    let mut out = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &x.qs[32 * half..32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 16 * part..16 * part + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let sub = if x.hmask[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub) as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

fn q4_k(x: &BlockQ4K, y: &mut [f32]) {
    let (d, min) = (x.d.to_f32(), x.dmin.to_f32());
    for g in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * g, &x.scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, &x.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &x.qs[32 * g..32 * g + 32];
        let y = &mut y[64 * g..64 * g + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xf) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q5_k(x: &BlockQ5K, y: &mut [f32]) {
    let (d, min) = (x.d.to_f32(), x.dmin.to_f32());
    for g in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * g, &x.scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, &x.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
        let ql = &x.qs[32 * g..32 * g + 32];
        let y = &mut y[64 * g..64 * g + 64];
        for l in 0..32 {
            let h1 = if x.qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if x.qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0xf) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

fn q6_k(x: &BlockQ6K, y: &mut [f32]) {
    let d = x.d.to_f32();
    for half in 0..2 {
        let ql = &x.ql[64 * half..64 * half + 64];
        let qh = &x.qh[32 * half..32 * half + 32];
        let sc = &x.scales[8 * half..8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lengths_are_errors() {
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(QuantError::ByteLen { .. })
        ));
        let mut out = [0f32; 33];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out),
            Err(QuantError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::I8, &[0u8; 33], &mut out),
            Err(QuantError::Unsupported { .. })
        ));
    }
}
