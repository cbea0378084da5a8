//! Helpers shared by the integration tests: a seeded RNG and test-data paths.
#![allow(dead_code)]

use kestrel_quant::GgmlType;
use std::path::PathBuf;

/// xorshift64*: deterministic, dependency-free.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of 4 uniforms, scaled to unit variance).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum::<f32>() - 2.0;
        s * 3f32.sqrt()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Byte offsets of the f16 scale fields of one block (to overwrite random bytes with sane halves).
pub fn half_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => &[0, 2],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// A random row of `n` elements of `ty`: random bytes with small finite f16 scales (and no -128
/// in Q8_0 weights, which llama.cpp's quantizer never writes and its SIMD kernels assume).
pub fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let mut out = vec![0u8; kestrel_quant::row_bytes(ty, n).unwrap()];
            kestrel_quant::quantize_row(ty, &x, &mut out).unwrap();
            out
        }
        _ => {
            let bb = ty.block_bytes() as usize;
            let mut out = rng.bytes(kestrel_quant::row_bytes(ty, n).unwrap());
            for block in out.chunks_exact_mut(bb) {
                for &off in half_fields(ty) {
                    let h = kestrel_quant::float16::f32_to_f16(rng.normal() * 0.02);
                    block[off..off + 2].copy_from_slice(&h.to_le_bytes());
                }
                if ty == GgmlType::Q8_0 {
                    for b in &mut block[2..] {
                        if *b == 0x80 {
                            *b = 0x81;
                        }
                    }
                }
            }
            out
        }
    }
}
