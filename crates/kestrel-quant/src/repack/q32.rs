//! Q8_0, Q5_0 and Q4_0 (32-element blocks, against Q8_0 activations) repacked into 16-row groups,
//! with llama.cpp's f32 arithmetic for them (its `vec_dot` and tinyBLAS alike): per block and
//! row, 8 integer lanes of 4 products (lane `l` holds elements `4l .. 4l + 4`), then
//! `acc_l = fma(dx * dy, lane_l, acc_l)`, and at the end `hsum_float_8`. Here each lane is one
//! vector over the 16 rows, from one `vpdpbusd` of unsigned levels `u = q + off` (`off` 128 for
//! Q8_0, 16 for Q5_0, 8 for Q4_0) seeded with `-off * (y_4l + .. + y_4l+3)`, so the sums are
//! exact.
//!
//! Layout of one group (16 rows), per block, as many bytes as the 16 native blocks:
//! - Q8_0, 544 bytes: `u[8][16][4]` (chunk l, row r, element `4l + k`), then `d[16]` f16;
//! - Q5_0, 352 bytes: `lo[4][16][4]` (byte = low nibbles of chunks m and m + 4), then
//!   `hi[8]` u64 (chunk l's fifth bits, bit `4r + k`), then `d[16]` f16;
//! - Q4_0, 288 bytes: `lo[4][16][4]` as Q5_0's (each byte is the file's own), then `d[16]` f16.
//!
//! Blocks go in pairs `[levels 2p][d 2p][d 2p+1][levels 2p+1]` so every block's levels start on
//! a cache line; groups are padded to one. Matmuls over many tokens unpack a Q5_0 or Q4_0
//! group once into the Q8_0 form (levels as bytes) and run the Q8_0 kernel on it.

use super::{AlignedBytes, R};
use crate::float16::f16_to_f32;
use crate::QuantError;
use kestrel_gguf::GgmlType;

const QK: usize = 32;
const Q8_ACT_BYTES: usize = 34;
const D_BYTES: usize = 2 * R;
const Q8_LEVELS: usize = 8 * R * 4;
const Q5_LEVELS: usize = 4 * R * 4 + 8 * 8;
const Q4_LEVELS: usize = 4 * R * 4;
/// Tokens from which a Q5_0 or Q4_0 matmul unpacks each group into the Q8_0 form first.
const UNPACK_MIN_TOKENS: usize = 8;

/// Bytes of one group's block.
pub const fn group_block_bytes(ty: GgmlType) -> usize {
    levels_bytes(ty) + D_BYTES
}

const fn levels_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q5_0 => Q5_LEVELS,
        GgmlType::Q4_0 => Q4_LEVELS,
        _ => Q8_LEVELS,
    }
}

/// Where block `i`'s levels and `d` start in a group of blocks of `levels` level bytes.
#[inline(always)]
fn offsets(levels: usize, i: usize) -> (usize, usize) {
    let base = (i / 2) * 2 * (levels + D_BYTES);
    if i.is_multiple_of(2) {
        (base, base + levels)
    } else {
        (base + levels + 2 * D_BYTES, base + levels + D_BYTES)
    }
}

/// Activation rows of a matmul (Q8_0), prepared once for every group: each block's `dy` as
/// f32 and each chunk's seed `-off * sum of its 4 quants`.
pub struct Q32Acts<'a> {
    rows: &'a [&'a [u8]],
    dy: Vec<f32>,
    seed: Vec<i32>,
}

/// A Q8_0, Q5_0 or Q4_0 matrix (`rows` a multiple of 16) in the repacked layout.
pub struct Q32Repacked {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    stride: usize,
    data: AlignedBytes,
}

/// Offset that makes a type's levels unsigned.
fn level_offset(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q5_0 => 16,
        GgmlType::Q4_0 => 8,
        _ => 128,
    }
}

/// A native block's d (f16 bits) and 32 unsigned levels.
fn native_levels(ty: GgmlType, b: &[u8]) -> (u16, [u8; QK]) {
    let d = u16::from_le_bytes([b[0], b[1]]);
    let mut u = [0u8; QK];
    if ty == GgmlType::Q4_0 {
        for (j, v) in u.iter_mut().enumerate() {
            *v = b[2 + j % 16] >> (4 * (j / 16)) & 15;
        }
    } else if ty == GgmlType::Q5_0 {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (j, v) in u.iter_mut().enumerate() {
            let lo = if j < 16 {
                b[6 + j] & 15
            } else {
                b[6 + j - 16] >> 4
            };
            *v = lo | ((qh >> j & 1) as u8) << 4;
        }
    } else {
        for (j, v) in u.iter_mut().enumerate() {
            *v = b[2 + j] ^ 0x80;
        }
    }
    (d, u)
}

impl Q32Repacked {
    /// Repack `rows` rows of `cols` elements of `ty` (Q8_0, Q5_0 or Q4_0; `bytes` row-major).
    pub fn new(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        Self::new_with(ty, bytes, rows, cols, &mut |_| {})
    }

    /// [`Self::new`], calling `done(rows)` as the first `rows` rows are repacked (every
    /// 1,024 rows), so the caller can release their source pages as it goes.
    pub fn new_with(
        ty: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        done: &mut dyn FnMut(usize),
    ) -> Result<Self, QuantError> {
        if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0) {
            return Err(QuantError::Unsupported { ty, op: "repack" });
        }
        let row_bytes = super::source_row_bytes(
            ty,
            bytes,
            rows,
            cols,
            "Q8_0 / Q5_0 / Q4_0 repack (rows must be a multiple of 16)",
        )?;
        let nb = cols / QK;
        let (levels, native) = (levels_bytes(ty), row_bytes / nb);
        let stride = (nb * group_block_bytes(ty)).next_multiple_of(64);
        let mut data = AlignedBytes::zeroed(rows / R * stride);
        let buf = data.as_mut_slice();
        for g in 0..rows / R {
            let dst = &mut buf[g * stride..][..nb * group_block_bytes(ty)];
            for i in 0..nb {
                let (lv, dp) = offsets(levels, i);
                for r in 0..R {
                    let src = &bytes[(g * R + r) * row_bytes + i * native..][..native];
                    let (d, u) = native_levels(ty, src);
                    dst[dp + 2 * r..dp + 2 * r + 2].copy_from_slice(&d.to_le_bytes());
                    for (j, &v) in u.iter().enumerate() {
                        let (l, k) = (j / 4, j % 4);
                        if ty == GgmlType::Q8_0 {
                            dst[lv + 64 * l + 4 * r + k] = v;
                        } else {
                            dst[lv + 64 * (l % 4) + 4 * r + k] |= (v & 15) << (4 * (l / 4));
                            if ty == GgmlType::Q5_0 {
                                let bit = 4 * r + k;
                                dst[lv + 256 + 8 * l + bit / 8] |= (v >> 4) << (bit % 8);
                            }
                        }
                    }
                }
            }
            if (g + 1) % 64 == 0 {
                done((g + 1) * R);
            }
        }
        Ok(Self {
            ty,
            rows,
            cols,
            stride,
            data,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` as the file stored it (`out`: the row's bytes, 34, 22 or 18 per block).
    pub fn native_row(&self, r: usize, out: &mut [u8]) {
        let (g, rr) = (r / R, r % R);
        let w = self.group(g);
        for (i, blk) in out
            .chunks_exact_mut(self.ty.block_bytes() as usize)
            .enumerate()
        {
            let (_, dp) = offsets(levels_bytes(self.ty), i);
            blk[0..2].copy_from_slice(&w[dp + 2 * rr..dp + 2 * rr + 2]);
            let u: Vec<u8> = (0..QK).map(|j| self.level(w, i, rr, j) as u8).collect();
            if self.ty == GgmlType::Q8_0 {
                for j in 0..QK {
                    blk[2 + j] = u[j] ^ 0x80;
                }
            } else if self.ty == GgmlType::Q4_0 {
                for j in 0..16 {
                    blk[2 + j] = u[j] | u[j + 16] << 4;
                }
            } else {
                let qh = (0..QK).fold(0u32, |h, j| h | ((u[j] >> 4) as u32) << j);
                blk[2..6].copy_from_slice(&qh.to_le_bytes());
                for j in 0..16 {
                    blk[6 + j] = (u[j] & 15) | (u[j + 16] & 15) << 4;
                }
            }
        }
    }

    fn group(&self, g: usize) -> &[u8] {
        &self.data.as_slice()[g * self.stride..][..self.cols / QK * group_block_bytes(self.ty)]
    }

    /// Prepares a matmul's Q8_0 activation rows (`cols` each) for [`Q32Repacked::dot_group`].
    pub fn prepare<'a>(&self, rows: &'a [&'a [u8]]) -> Result<Q32Acts<'a>, QuantError> {
        let nb = self.cols / QK;
        let off = level_offset(self.ty);
        let mut dy = Vec::with_capacity(rows.len() * nb);
        let mut seed = Vec::with_capacity(rows.len() * nb * 8);
        for a in rows {
            if a.len() != nb * Q8_ACT_BYTES {
                return Err(QuantError::Len {
                    what: "Q8_0 activation row",
                    expected: nb * Q8_ACT_BYTES,
                    got: a.len(),
                });
            }
            for b in a.chunks_exact(Q8_ACT_BYTES) {
                dy.push(f16_to_f32(u16::from_le_bytes([b[0], b[1]])));
                for c in b[2..].chunks_exact(4) {
                    seed.push(-off * c.iter().map(|&q| q as i8 as i32).sum::<i32>());
                }
            }
        }
        Ok(Q32Acts { rows, dy, seed })
    }

    /// Rows `16 g .. 16 g + 16` against every prepared activation row: `out[t * 16 + r]`.
    pub fn dot_group(&self, g: usize, acts: &Q32Acts, out: &mut [f32]) -> Result<(), QuantError> {
        let nb = self.cols / QK;
        let t_len = acts.rows.len();
        if g >= self.rows / R
            || out.len() != t_len * R
            || acts.dy.len() != t_len * nb
            || acts.seed.len() != t_len * nb * 8
        {
            return Err(QuantError::Len {
                what: "Q8_0 / Q5_0 repacked group output",
                expected: t_len * R,
                got: out.len(),
            });
        }
        let w = self.group(g);
        #[cfg(target_arch = "x86_64")]
        if super::avx512_available() {
            // The weight stream is prefetched for decode (few tokens) reading the group from
            // memory; an unpacked group is already in L2.
            let ahead = if t_len <= 4 {
                crate::cpu::weight_prefetch_ahead()
            } else {
                0
            };
            let run = |w: &[u8], ty: GgmlType, ahead: usize, out: &mut [f32]| {
                let mut c = 0;
                while c < t_len {
                    let n = (t_len - c).min(2);
                    let o = &mut out[c * R..(c + n) * R];
                    // SAFETY: AVX-512 VNNI is available; the group, the activation rows and
                    // their preparation were length-checked above.
                    unsafe {
                        use avx512::{lanes, Q4, Q5, Q8};
                        match (ty, n) {
                            (GgmlType::Q5_0, 2) => lanes::<2, Q5>(nb, w, ahead, acts, c, o),
                            (GgmlType::Q5_0, _) => lanes::<1, Q5>(nb, w, ahead, acts, c, o),
                            (GgmlType::Q4_0, 2) => lanes::<2, Q4>(nb, w, ahead, acts, c, o),
                            (GgmlType::Q4_0, _) => lanes::<1, Q4>(nb, w, ahead, acts, c, o),
                            (_, 2) => lanes::<2, Q8>(nb, w, ahead, acts, c, o),
                            (_, _) => lanes::<1, Q8>(nb, w, ahead, acts, c, o),
                        }
                    }
                    c += n;
                }
            };
            if self.ty == GgmlType::Q8_0 || t_len < UNPACK_MIN_TOKENS {
                run(w, self.ty, ahead, out);
            } else {
                thread_local! {
                    static UNPACKED: std::cell::RefCell<AlignedBytes> = std::cell::RefCell::new(AlignedBytes::zeroed(0));
                }
                UNPACKED.with_borrow_mut(|buf| {
                    let len = nb * group_block_bytes(GgmlType::Q8_0);
                    if buf.len() < len {
                        *buf = AlignedBytes::zeroed(len);
                    }
                    let dst = &mut buf.as_mut_slice()[..len];
                    // SAFETY: AVX-512 VNNI is available; `dst` holds the Q8_0 form of `nb`
                    // blocks and `w` the form of `self.ty`.
                    unsafe {
                        match self.ty {
                            GgmlType::Q5_0 => avx512::unpack::<{ avx512::Q5 }>(nb, w, dst),
                            _ => avx512::unpack::<{ avx512::Q4 }>(nb, w, dst),
                        }
                    }
                    run(dst, GgmlType::Q8_0, 0, out);
                });
            }
            return Ok(());
        }
        for t in 0..t_len {
            self.dot_scalar(w, acts, t, &mut out[t * R..(t + 1) * R]);
        }
        Ok(())
    }

    /// Row r's level of element j of block i in a group `w`.
    fn level(&self, w: &[u8], i: usize, r: usize, j: usize) -> i32 {
        let (lv, _) = offsets(levels_bytes(self.ty), i);
        let (l, k) = (j / 4, j % 4);
        if self.ty == GgmlType::Q8_0 {
            return w[lv + 64 * l + 4 * r + k] as i32;
        }
        let lo = w[lv + 64 * (l % 4) + 4 * r + k] >> (4 * (l / 4)) & 15;
        if self.ty == GgmlType::Q4_0 {
            return lo as i32;
        }
        let bit = 4 * r + k;
        let hi = w[lv + 256 + 8 * l + bit / 8] >> (bit % 8) & 1;
        (lo | hi << 4) as i32
    }

    /// The arithmetic of the SIMD kernels one row at a time: their oracle.
    fn dot_scalar(&self, w: &[u8], acts: &Q32Acts, t: usize, out: &mut [f32]) {
        let nb = self.cols / QK;
        let y = acts.rows[t];
        for (r, o) in out.iter_mut().enumerate() {
            let mut acc = [0f32; 8];
            for i in 0..nb {
                let (_, dp) = offsets(levels_bytes(self.ty), i);
                let dx = f16_to_f32(u16::from_le_bytes([w[dp + 2 * r], w[dp + 2 * r + 1]]));
                let d = dx * acts.dy[t * nb + i];
                for (l, a) in acc.iter_mut().enumerate() {
                    let mut s = acts.seed[(t * nb + i) * 8 + l];
                    for k in 0..4 {
                        let j = 4 * l + k;
                        s += self.level(w, i, r, j) * y[i * Q8_ACT_BYTES + 2 + j] as i8 as i32;
                    }
                    *a = d.mul_add(s as f32, *a);
                }
            }
            *o = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        }
    }
}

// Per-token and per-lane register arrays are indexed by constant loop counters (unrolled).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// The layouts, by the bits of a level (the kernels' constant parameter).
    pub(super) const Q8: u8 = 8;
    pub(super) const Q5: u8 = 5;
    pub(super) const Q4: u8 = 4;

    const fn levels(bits: u8) -> usize {
        match bits {
            Q5 => Q5_LEVELS,
            Q4 => Q4_LEVELS,
            _ => Q8_LEVELS,
        }
    }

    /// Block i's 8 chunks of unsigned levels (16 rows x 4 elements each) in a group of the
    /// `BITS` layout, and where its `d` are.
    #[inline(always)]
    unsafe fn chunks<const BITS: u8>(w: *const u8, i: usize) -> ([__m512i; 8], *const u8) {
        let (lv, dp) = offsets(levels(BITS), i);
        let p = w.add(lv);
        if BITS == Q8 {
            let u = std::array::from_fn(|l| _mm512_loadu_si512(p.add(64 * l) as *const _));
            return (u, w.add(dp));
        }
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(16);
        let hi = p.add(256) as *const u64;
        let mut u = [_mm512_setzero_si512(); 8];
        for m in 0..4 {
            let z = _mm512_loadu_si512(p.add(64 * m) as *const _);
            let lo = _mm512_and_si512(z, m4);
            let up = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
            if BITS == Q5 {
                u[m] = _mm512_mask_add_epi8(lo, hi.add(m).read_unaligned(), lo, sixteen);
                u[m + 4] = _mm512_mask_add_epi8(up, hi.add(m + 4).read_unaligned(), up, sixteen);
            } else {
                (u[m], u[m + 4]) = (lo, up);
            }
        }
        (u, w.add(dp))
    }

    /// 16 rows x `N` tokens (`t0..t0 + N` of `acts`), prefetching the group `ahead` bytes
    /// ahead of its reads (0: not at all).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn lanes<const N: usize, const BITS: u8>(
        nb: usize,
        w: &[u8],
        ahead: usize,
        acts: &Q32Acts,
        t0: usize,
        out: &mut [f32],
    ) {
        let mut acc = [[_mm512_setzero_ps(); 8]; N];
        let y: [*const u8; N] = std::array::from_fn(|c| acts.rows[t0 + c].as_ptr());
        let dy: [*const f32; N] = std::array::from_fn(|c| acts.dy.as_ptr().add((t0 + c) * nb));
        let seed: [*const i32; N] =
            std::array::from_fn(|c| acts.seed.as_ptr().add((t0 + c) * nb * 8));
        let block_bytes = levels(BITS) + D_BYTES;
        for i in 0..nb {
            crate::cpu::prefetch_ahead(
                w.as_ptr().wrapping_add(i * block_bytes),
                ahead,
                block_bytes,
            );
            let (u, dp) = chunks::<BITS>(w.as_ptr(), i);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(dp as *const __m256i));
            for c in 0..N {
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(*dy[c].add(i)));
                let q = y[c].add(i * Q8_ACT_BYTES + 2) as *const i32;
                let s = seed[c].add(i * 8);
                for l in 0..8 {
                    let dot = _mm512_dpbusd_epi32(
                        _mm512_set1_epi32(*s.add(l)),
                        u[l],
                        _mm512_set1_epi32(q.add(l).read_unaligned()),
                    );
                    acc[c][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), acc[c][l]);
                }
            }
        }
        for c in 0..N {
            let a = &acc[c];
            let s = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
            );
            _mm512_storeu_ps(out.as_mut_ptr().add(c * R), s);
        }
    }

    /// A Q5_0 or Q4_0 group (`nb` blocks, the `BITS` layout) rewritten in the Q8_0 form
    /// (levels as bytes, same `d`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn unpack<const BITS: u8>(nb: usize, w: &[u8], dst: &mut [u8]) {
        for i in 0..nb {
            let (u, dp) = chunks::<BITS>(w.as_ptr(), i);
            let (lv, dq) = offsets(Q8_LEVELS, i);
            let p = dst.as_mut_ptr();
            for (l, v) in u.iter().enumerate() {
                _mm512_storeu_si512(p.add(lv + 64 * l) as *mut _, *v);
            }
            std::ptr::copy_nonoverlapping(dp, p.add(dq), D_BYTES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repack::testing::{assert_rows_round_trip, assert_same_results, Rng};

    #[test]
    fn simd_equals_the_scalar_form_and_the_row_major_kernels() {
        let (rows, cols) = (32, 160);
        let mut rng = Rng::new(0x5eed_1234_abcd_0001);
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0] {
            let (w, rb) = rng.matrix(ty, rows, cols);
            let packed = Q32Repacked::new(ty, &w, rows, cols).unwrap();
            assert_rows_round_trip(&w, rb, |r, out| packed.native_row(r, out));
            let ab = crate::row_bytes(GgmlType::Q8_0, cols).unwrap();
            for t in [1usize, 2, 3, 8, 11] {
                let acts = rng.acts(GgmlType::Q8_0, t, cols);
                let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
                let prepared = packed.prepare(&act_rows).unwrap();
                for g in 0..rows / R {
                    let mut got = vec![0f32; t * R];
                    packed.dot_group(g, &prepared, &mut got).unwrap();
                    let mut want = vec![0f32; t * R];
                    for c in 0..t {
                        packed.dot_scalar(
                            packed.group(g),
                            &prepared,
                            c,
                            &mut want[c * R..(c + 1) * R],
                        );
                    }
                    let rows_here: Vec<&[u8]> =
                        w[g * R * rb..(g + 1) * R * rb].chunks(rb).collect();
                    let mut row_major = vec![0f32; R * t];
                    crate::vec_dot_rows(ty, cols, &rows_here, &act_rows, &mut row_major).unwrap();
                    assert_same_results(&got, &want, &row_major, t, &format!("{ty} t {t} g {g}"));
                }
            }
            assert!(Q32Repacked::new(ty, &w[..rb * 8], 8, cols).is_err());
        }
    }
}
