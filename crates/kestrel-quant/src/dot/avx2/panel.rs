//! Prefill over the 32-element block types on AVX2: weight rows decoded once into a [`Panel`]
//! for a whole batch of activation rows, then register tiles of four rows x two tokens (eight
//! accumulators, the four rows' quants and two tokens' activations in the 16 registers).
//!
//! Per row, token and block the integer lanes are the exact sums of four products that
//! [`dot`](super::dot) makes, and the f32 steps its (`acc = fma(dx * dy, lanes, acc)` in block
//! order, `hsum8`, then the mins' `fma(m, s, summs)`), so the results equal it bit for bit. What
//! moves out of the inner loop: the weights' unpacking (once per panel, not once per four
//! tokens), the scales' f16 conversion (once per call for the activations, once per panel for
//! the weights) and their products (one 8-lane multiply per block and tile).

// Per-row and per-token register arrays are indexed by constant loop counters (unrolled).
#![allow(clippy::needless_range_loop)]

use super::super::x86::*;
use super::{layout, quants, with_min, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::dot::q32::PrefillPanel;
use kestrel_gguf::GgmlType;

/// Weight rows decoded for a whole batch of activation rows, in quads of four rows; rows past
/// the end of a quad are zero. Per row and block the quants as 32 signed bytes (`q - 8`,
/// `q - 16`, `q`; Q4_1's and Q5_1's `q` as is), entering the `maddubs` as:
/// - Q4_0, Q5_0: the signed operand against the activations made unsigned (`y + 128`, once per
///   token and block), with a seed `-128 * (sum of each 4 quants)` that takes the `+ 128` off
///   (one add a product vector where the sign trick takes a `vpsignb`: 10% faster here);
/// - Q8_0: llama.cpp's sign trick, `|q|` against `sign(y, q)` (`(y + 128) * q` pairs could
///   saturate an i16);
/// - Q4_1, Q5_1: the unsigned operand against the activations as they are.
///
/// A quad of a 4,864-column Q5_0 row is 39 KB, of a 896-column one 7 KB.
pub(crate) struct Panel {
    /// `[quad][block][row]`
    x: Vec<__m256i>,
    /// `[quad][block][row]`, Q4_0 and Q5_0 only: the seed `-128 * (sum of each 4 quants)`.
    seed: Vec<__m256i>,
    /// `[quad][block]`, lane `2r + c` = row r's scale (each twice, for two tokens).
    dx: Vec<__m256>,
    /// `[quad][block][row]`: Q4_1's and Q5_1's mins.
    m: Vec<f32>,
    /// A tile's scale products, `[block]`, lane `2r + c` (scratch of [`Panel::tile`]).
    prod: Vec<__m256>,
}

impl PrefillPanel for Panel {
    const TOKENS: usize = 2;

    fn new() -> Self {
        Self {
            x: Vec::new(),
            seed: Vec::new(),
            dx: Vec::new(),
            m: Vec::new(),
            prod: Vec::new(),
        }
    }

    unsafe fn fill(&mut self, w: GgmlType, nb: usize, x: &[*const u8]) {
        match w {
            GgmlType::Q4_0 => fill::<Q4_0>(self, nb, x),
            GgmlType::Q5_0 => fill::<Q5_0>(self, nb, x),
            GgmlType::Q8_0 => fill::<Q8_0>(self, nb, x),
            GgmlType::Q5_1 => fill::<Q5_1>(self, nb, x),
            _ => fill::<Q4_1>(self, nb, x),
        }
    }

    unsafe fn tile(
        &mut self,
        w: GgmlType,
        nb: usize,
        q: usize,
        y: [*const u8; 4],
        dyt: *const f32,
    ) -> [f32; 16] {
        let y = [y[0], y[1]];
        match w {
            GgmlType::Q4_0 => tile::<Q4_0>(self, nb, q, y, dyt),
            GgmlType::Q5_0 => tile::<Q5_0>(self, nb, q, y, dyt),
            GgmlType::Q8_0 => tile::<Q8_0>(self, nb, q, y, dyt),
            GgmlType::Q5_1 => tile::<Q5_1>(self, nb, q, y, dyt),
            _ => tile::<Q4_1>(self, nb, q, y, dyt),
        }
    }
}

/// Whether a type's panel holds seeds: Q4_0 and Q5_0, which enter signed against unsigned
/// activations.
const fn seeded(t: u8) -> bool {
    matches!(t, Q4_0 | Q5_0)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill<const T: u8>(panel: &mut Panel, nb: usize, x: &[*const u8]) {
    let (bx, _, _) = layout(T);
    let quads = x.len().div_ceil(4);
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let ones = _mm256_set1_epi16(1);
    panel.x.clear();
    panel.seed.clear();
    panel.dx.clear();
    panel.m.clear();
    for q in 0..quads {
        for i in 0..nb {
            let mut dx = [0f32; 8];
            for r in 0..4 {
                let Some(&row) = x.get(4 * q + r) else {
                    panel.x.push(_mm256_setzero_si256());
                    if seeded(T) {
                        panel.seed.push(_mm256_setzero_si256());
                    }
                    panel.m.push(0.0);
                    continue;
                };
                let b = row.add(i * bx);
                let sq = quants::<T>(b);
                panel.x.push(sq);
                if seeded(T) {
                    let sum = _mm256_madd_epi16(_mm256_maddubs_epi16(flip, sq), ones);
                    panel
                        .seed
                        .push(_mm256_sub_epi32(_mm256_setzero_si256(), sum));
                }
                dx[2 * r..2 * r + 2].fill(fp16(b));
                panel.m.push(if with_min(T) { fp16(b.add(2)) } else { 0.0 });
            }
            panel.dx.push(_mm256_loadu_ps(dx.as_ptr()));
        }
    }
}

/// Two activation rows against quad `q`: lane `4c + r` of the result is row r . token c.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: u8>(
    panel: &mut Panel,
    nb: usize,
    q: usize,
    y: [*const u8; 2],
    dyt: *const f32,
) -> [f32; 16] {
    let (_, by, qoff) = layout(T);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    // Q4_1's and Q5_1's m . sy, `[token][row]`.
    let mut summ = [[0f32; 4]; 2];
    let xs = panel.x.as_ptr().add(q * nb * 4);
    // (empty but for Q4_0 and Q5_0, whose arms alone read it)
    let seeds = panel.seed.as_ptr().wrapping_add(q * nb * 4);
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let dxs = panel.dx.as_ptr().add(q * nb);
    // All blocks' scale products first (lane 2r + c), so the FMAs' broadcast loads never wait
    // on a store just made.
    panel.prod.resize(nb, _mm256_setzero_ps());
    for (i, p) in panel.prod.iter_mut().enumerate() {
        // The two tokens' scales of block i, as one 64-bit lane broadcast.
        let pair = (dyt.add(2 * i) as *const i64).read_unaligned();
        let dy = _mm256_castsi256_ps(_mm256_set1_epi64x(pair));
        *p = _mm256_mul_ps(*dxs.add(i), dy);
    }
    let prods = panel.prod.as_ptr() as *const f32;
    for i in 0..nb {
        let prod = prods.add(8 * i);
        let ys = [0, 1].map(|c| _mm256_loadu_si256(y[c].add(i * by + qoff) as *const __m256i));
        let us = ys.map(|v| _mm256_xor_si256(v, flip));
        for r in 0..4 {
            let x = *xs.add(4 * i + r);
            let ax = _mm256_sign_epi8(x, x);
            let lanes = |c: usize| match T {
                Q4_1 | Q5_1 => _mm256_madd_epi16(_mm256_maddubs_epi16(x, ys[c]), ones),
                Q8_0 => {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(ys[c], x)), ones)
                }
                _ => _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(us[c], x), ones),
                    *seeds.add(4 * i + r),
                ),
            };
            for c in 0..2 {
                let d = _mm256_broadcast_ss(&*prod.add(2 * r + c));
                acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes(c)), acc[r][c]);
            }
        }
        if with_min(T) {
            for (c, sc) in summ.iter_mut().enumerate() {
                let sy = fp16(y[c].add(i * by + 2));
                for (r, s) in sc.iter_mut().enumerate() {
                    let m = *panel.m.get_unchecked((q * nb + i) * 4 + r);
                    *s = m.mul_add(sy, *s);
                }
            }
        }
    }
    let mut out = [0f32; 16];
    for c in 0..2 {
        for r in 0..4 {
            out[4 * c + r] = hsum8(acc[r][c]) + summ[c][r];
        }
    }
    out
}
