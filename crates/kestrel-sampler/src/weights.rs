//! Softmax weights `exp(logit - max)` over a whole vocabulary, fast.
//!
//! A draw over an untruncated 152k vocabulary (an OpenAI client's defaults: temperature 1, no
//! top-k) took ~1.4 ms a token through `f64::exp` (2-vCPU Zen 4): about a GPU's decode step.
//! Here `exp` is an f32 polynomial written in plain multiplies and adds (no `mul_add`; Rust
//! never contracts into FMAs), so loops over it vectorize, as wide as the CPU allows, and
//! every CPU gets the same bits.

use crate::Candidate;

const SHIFT: f32 = 12_582_912.0; // 1.5 x 2^23: adding it rounds to an integer in the low bits
const LOG2E: f32 = std::f32::consts::LOG2_E;
// ln 2 split in two (Cody-Waite): n * LN2_HI is exact for the n that occur (|n| <= 126)
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
// e^r on |r| <= ln2 / 2: degree-5 minimax (ggml's `ggml_v_expf` coefficients)
const C1: f32 = f32::from_bits(0x3f7f_fff6);
const C2: f32 = f32::from_bits(0x3eff_fedb);
const C3: f32 = f32::from_bits(0x3e2a_af33);
const C4: f32 = f32::from_bits(0x3d2b_9f17);
const C5: f32 = f32::from_bits(0x3c07_2010);
/// Below this `exp` is taken as 0 (e^-87 ~ 1.6e-38, the smallest normal f32): `-inf` logits
/// must weigh exactly nothing.
const FLOOR: f32 = -87.0;

/// `e^x` for `x <= 0` (within ~2 ulp; 0 below -87, `-inf` and NaN included: a NaN logit
/// weighs what `-inf` does). Branch-free.
#[inline(always)]
pub(crate) fn exp_nonpos(x: f32) -> f32 {
    let inside = x >= FLOOR; // false for NaN
    let xc = if inside { x } else { FLOOR };
    let z = xc * LOG2E + SHIFT;
    let n = z - SHIFT;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    // Estrin's order: short dependency chains, so the lanes of a block overlap
    let r2 = r * r;
    let p = (1.0 + r * C1) + r2 * ((C2 + r * C3) + r2 * (C4 + r * C5));
    // 2^n from n's integer bits (n in [-126, 0]: a normal exponent)
    let ni = z.to_bits() as i32 - SHIFT.to_bits() as i32;
    let scale = f32::from_bits(((ni + 127) << 23) as u32);
    if inside {
        p * scale
    } else {
        0.0
    }
}

/// Unnormalized softmax weight `exp(logit - max)`, exactly `1` at the max so that `+inf`
/// logits do not give `inf - inf = NaN`.
#[inline(always)]
pub(crate) fn weight(logit: f32, max: f32) -> f64 {
    f64::from(weight32(logit, max))
}

#[inline(always)]
fn weight32(logit: f32, max: f32) -> f32 {
    if logit == max {
        1.0
    } else {
        exp_nonpos(logit - max)
    }
}

/// Logits a block of the sums below takes at once: weighed and summed in f32 lanes (a
/// block's 64 weights, each <= 1, lose nothing an f32 sum would notice), the block's sum then
/// added in f64, block after block.
const BLOCK: usize = 64;
const LANES: usize = 16;

#[inline(always)]
fn block_sum(logits: &[f32; BLOCK], max: f32) -> f64 {
    let mut lanes = [0f32; LANES];
    for quarter in logits.chunks_exact(LANES) {
        for (acc, &l) in lanes.iter_mut().zip(quarter) {
            *acc += weight32(l, max);
        }
    }
    for half in [8, 4, 2, 1] {
        for i in 0..half {
            lanes[i] += lanes[i + half];
        }
    }
    f64::from(lanes[0])
}

#[inline(always)]
fn sum_body(values: &[f32], max: f32) -> f64 {
    let mut total = 0f64;
    let mut blocks = values.chunks_exact(BLOCK);
    for b in &mut blocks {
        if let Ok(b) = <&[f32; BLOCK]>::try_from(b) {
            total += block_sum(b, max);
        }
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut last = [f32::NEG_INFINITY; BLOCK];
        last[..rest.len()].copy_from_slice(rest);
        total += block_sum(&last, max);
    }
    total
}

/// The same body compiled for wider vectors where the CPU has them: plain multiplies and
/// adds (never contracted into FMAs), so every path gives the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(values: &[f32], max: f32) -> f64 {
    sum_body(values, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(values: &[f32], max: f32) -> f64 {
    sum_body(values, max)
}

/// The sum of [`weight`] over `values`, block by block from its start (the order every caller
/// shares, so equal lists give equal bits).
pub(crate) fn sum_values(values: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked above).
            return unsafe { sum_avx512(values, max) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            return unsafe { sum_avx2(values, max) };
        }
    }
    sum_body(values, max)
}

#[inline(always)]
fn weights_body(values: &[f32], max: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(values) {
        *o = weight32(v, max);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weights_avx512(values: &[f32], max: f32, out: &mut [f32]) {
    weights_body(values, max, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weights_avx2(values: &[f32], max: f32, out: &mut [f32]) {
    weights_body(values, max, out)
}

/// [`weight`] of each of `values` into `out` (as f32: the same bits), vectorized.
pub(crate) fn weights_into(values: &[f32], max: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked above).
            return unsafe { weights_avx512(values, max, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            return unsafe { weights_avx2(values, max, out) };
        }
    }
    weights_body(values, max, out)
}

/// The sum of [`weight`] over `cands`' logits, gathered 1,024 at a time.
pub(crate) fn sum_weights(cands: &[Candidate], max: f32) -> f64 {
    let mut buf = [0f32; 1024];
    cands
        .chunks(buf.len())
        .map(|part| {
            for (b, c) in buf.iter_mut().zip(part) {
                *b = c.logit;
            }
            sum_values(&buf[..part.len()], max)
        })
        .sum()
}

/// The sum of [`weight`] over raw logits (NaN weighs nothing, as `-inf`).
pub(crate) fn sum_logit_weights(logits: &[f32], max: f32) -> f64 {
    sum_values(logits, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_of_f64_exp() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -87.0 {
            let got = f64::from(exp_nonpos(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
            x -= 0.000_37;
        }
        assert!(worst < 4e-7, "worst relative error {worst:e}");
        assert_eq!(exp_nonpos(0.0), 1.0);
    }

    #[test]
    fn nothing_below_the_floor_weighs() {
        for x in [-87.5f32, -100.0, -1e30, f32::NEG_INFINITY] {
            assert_eq!(exp_nonpos(x), 0.0, "{x}");
        }
        assert_eq!(weight(f32::NEG_INFINITY, 3.0), 0.0);
        assert_eq!(weight(f32::INFINITY, f32::INFINITY), 1.0);
        assert_eq!(weight(2.0, f32::INFINITY), 0.0);
    }

    #[test]
    fn block_sums_equal_a_plain_sum_up_to_rounding() {
        let logits: Vec<f32> = (0..1001)
            .map(|i| ((i * 7919) % 1000) as f32 / 50.0)
            .collect();
        let max = 999.0 / 50.0;
        let cands: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            })
            .collect();
        let plain: f64 = logits.iter().map(|&l| weight(l, max)).sum();
        let a = sum_weights(&cands, max);
        let b = sum_logit_weights(&logits, max);
        assert_eq!(a, b, "the same blocks over the same values");
        assert!(((a - plain) / plain).abs() < 1e-6, "{a} {plain}");
        let generic = sum_body(&logits, max);
        assert_eq!(
            a, generic,
            "the CPU's widest vectors give the portable path's bits"
        );
        let mut with_nan = logits.clone();
        with_nan[5] = f32::NAN;
        let mut with_inf = logits.clone();
        with_inf[5] = f32::NEG_INFINITY;
        assert_eq!(
            sum_values(&with_nan, max),
            sum_values(&with_inf, max),
            "NaN weighs as -inf"
        );
    }
}
