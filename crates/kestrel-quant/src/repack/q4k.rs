//! Q4_K (and Q5_K) repacked into 16-row groups; the f32 arithmetic follows llama.cpp's
//! repacked Q4_K kernels (`ggml_gemv/gemm_q4_K_8x8_q8_K`) exactly:
//!
//! - GEMV order (decode, and the last `T % 4` tokens of a matmul): per super-block, the whole
//!   integer sum `sum_j sc_j (q . y)_j` and the mins term `sum_j m_j bsum32_j` each go through
//!   one fused multiply-add, `A = fma(isum, d * yd, A)`, `M = fma(imin, dmin * yd, M)`;
//! - GEMM order (tokens in whole groups of four): the same per 64-element pair of sub-blocks;
//! - the result is `A - M`.
//!
//! Where the CPU has AMX, matmuls over [`super::AMX_MIN_TOKENS`] tokens or more take their
//! integer sums from tile products instead (`amx_kernel`); the sums are the same integers and
//! the f32 steps the same, so the results are too. On CPUs with AVX2 and no AVX-512 the `avx2`
//! kernels run the same layout eight rows at a time, with the same integers and f32 steps.
//!
//! Layout of one group (16 rows) and super-block, 2,304 bytes, as many as the 16 native
//! blocks: `d[16] f16, dmin[16] f16, scm[4][3][16] u8, qs[4][8][16][4] u8`. The f16 scales
//! convert exactly; `scm[sb]` holds the 6-bit scales and mins of sub-blocks `2 sb` (j0) and
//! `2 sb + 1` (j1) of each row r: `[0][r] = sc_j0 & 15 | (sc_j1 & 15) << 4`, `[1][r]` the same
//! of the mins, `[2][r]` their top two bits, `sc_j0 | sc_j1 << 2 | m_j0 << 4 | m_j1 << 6`. And
//! `qs[sb][k][r]` holds bytes `32 sb + 4k .. 32 sb + 4k + 4` of row r's native `qs`: low
//! nibbles are sub-block `2 sb`, high nibbles sub-block `2 sb + 1`, elements `4k .. 4k + 4`.
//!
//! Q5_K is Q4_K with a fifth bit per element: its groups' super-blocks hold `qh[sb][8][2] u64`
//! before each pair's `qs[sb]` (2,816 bytes, again the 16 native blocks' size), `qh[sb][k][0]`
//! the fifth bits of `qs[sb][k]`'s low nibbles (bit `4r + e` for row r's element `4k + e`),
//! `[1]` of its high nibbles. The kernels are Q4_K's over levels `q + 16 * bit` (AVX-512 adds the 16 under the
//! mask); the integer sums stay exact (at most 31 x 128 a product), the f32 steps are the same.
//! The AVX2 kernels sum Q5_K's sub-blocks in i16 four steps at a time instead of eight (31 x
//! 128 products); the AMX kernels run Q4_K only.

use super::{f16_at, f32_at, i16_at, AlignedBytes, AmxPanel, Q8K_BYTES, R};
use crate::blocks::{scale_min_k4, K_SCALE_SIZE, QK_K};
use crate::QuantError;
use kestrel_gguf::GgmlType;
use std::ptr::null;

const Q4K_BYTES: usize = 144;
const Q5K_BYTES: usize = 176;
const D_OFF: usize = 0;
const DMIN_OFF: usize = 2 * R;
const SCM_OFF: usize = 4 * R;
const QS_OFF: usize = SCM_OFF + 4 * 3 * R;
/// Bytes of one group's super-block.
pub const GROUP_BLOCK_BYTES: usize = QS_OFF + 4 * 8 * R * 4;
/// Bytes of a sub-block pair's quants and of (Q5_K) its fifth bits.
const QS_PAIR: usize = 8 * R * 4;
const QH_PAIR: usize = 8 * 16;
/// Bytes of one Q5_K group's super-block.
pub const Q5K_GROUP_BLOCK_BYTES: usize = QS_OFF + 4 * (QH_PAIR + QS_PAIR);

/// Where chunk `k` of sub-block pair `sb` (16 rows x 4 bytes) starts in a group super-block.
/// Q5_K keeps each pair's fifth bits just before its quants ([`qh_at`]), so a super-block is
/// read front to back (the bits at the end of it were a second stream that the hardware
/// prefetcher did not follow: decode read at 9 GB/s where Q4_K's reads at 24).
#[inline(always)]
pub(crate) const fn qs_at(fifth: bool, sb: usize, k: usize) -> usize {
    if fifth {
        QS_OFF + sb * (QH_PAIR + QS_PAIR) + QH_PAIR + k * R * 4
    } else {
        QS_OFF + (sb * 8 + k) * R * 4
    }
}

/// Where the fifth bits of chunk `k` of pair `sb` start in a Q5_K group super-block: a u64
/// for its low nibbles, then one for its high nibbles.
#[inline(always)]
pub(crate) const fn qh_at(sb: usize, k: usize) -> usize {
    QS_OFF + sb * (QH_PAIR + QS_PAIR) + k * 16
}

/// Bytes of a group's super-block: Q4_K's, or with `fifth` Q5_K's.
pub(crate) const fn block_bytes(fifth: bool) -> usize {
    if fifth {
        Q5K_GROUP_BLOCK_BYTES
    } else {
        GROUP_BLOCK_BYTES
    }
}

/// Up to this many tokens, the tiles take the scales from the packed group and prefetch the
/// weight stream (decode); past it, the group's scales are unpacked once first (1.5B, AMD VM,
/// 2 threads: pp9 149 tok/s unpacked first against 180 from the packed scales; pp512 the
/// other way round).
const FEW_TOKENS: usize = 16;

/// A Q4_K or Q5_K matrix (`rows` a multiple of 16) in the repacked layout.
pub struct Q4KRepacked {
    rows: usize,
    cols: usize,
    /// Q5_K: the layout's fifth bits.
    fifth: bool,
    data: AlignedBytes,
}

impl Q4KRepacked {
    /// Repack `rows` rows of `cols` elements of `ty` (Q4_K or Q5_K; `bytes` row-major, as in a
    /// GGUF file).
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
        let fifth = match ty {
            GgmlType::Q4_K => false,
            GgmlType::Q5_K => true,
            _ => return Err(QuantError::Unsupported { ty, op: "repack" }),
        };
        let row_bytes = super::source_row_bytes(
            ty,
            bytes,
            rows,
            cols,
            "Q4_K / Q5_K repack (rows must be a multiple of 16)",
        )?;
        let nb = cols / QK_K;
        let (native, gbb) = if fifth {
            (Q5K_BYTES, Q5K_GROUP_BLOCK_BYTES)
        } else {
            (Q4K_BYTES, GROUP_BLOCK_BYTES)
        };
        // Where the native block's quants start (Q5_K's fifth bits come before them).
        let qs_from = native - QK_K / 2;
        let mut data = AlignedBytes::zeroed(rows / R * nb * gbb);
        for g in 0..rows / R {
            for i in 0..nb {
                let dst = &mut data.as_mut_slice()[(g * nb + i) * gbb..][..gbb];
                for r in 0..R {
                    let src = &bytes[(g * R + r) * row_bytes + i * native..][..native];
                    dst[D_OFF + 2 * r..][..2].copy_from_slice(&src[0..2]);
                    dst[DMIN_OFF + 2 * r..][..2].copy_from_slice(&src[2..4]);
                    let mut scales = [0u8; K_SCALE_SIZE];
                    scales.copy_from_slice(&src[4..4 + K_SCALE_SIZE]);
                    for sb in 0..4 {
                        let (sc0, m0) = scale_min_k4(2 * sb, &scales);
                        let (sc1, m1) = scale_min_k4(2 * sb + 1, &scales);
                        let at = SCM_OFF + 3 * R * sb + r;
                        dst[at] = (sc0 & 15) | (sc1 & 15) << 4;
                        dst[at + R] = (m0 & 15) | (m1 & 15) << 4;
                        dst[at + 2 * R] =
                            sc0 >> 4 | (sc1 >> 4) << 2 | (m0 >> 4) << 4 | (m1 >> 4) << 6;
                    }
                    for sb in 0..4 {
                        for k in 0..8 {
                            let at = qs_at(fifth, sb, k) + 4 * r;
                            dst[at..at + 4].copy_from_slice(&src[qs_from + 32 * sb + 4 * k..][..4]);
                            if !fifth {
                                continue;
                            }
                            // Element 4k + e of sub-block j has its fifth bit at bit j of
                            // qh[4k + e]; here bit 4r + e of the (sb, k) mask of its nibbles.
                            for e in 0..4 {
                                let qh = src[16 + 4 * k + e];
                                let bit = 4 * r + e;
                                for (half, j) in [2 * sb, 2 * sb + 1].into_iter().enumerate() {
                                    let at = qh_at(sb, k) + 8 * half + bit / 8;
                                    dst[at] |= (qh >> j & 1) << (bit % 8);
                                }
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
            rows,
            cols,
            fifth,
            data,
        })
    }

    /// The file's type of these rows: Q4_K, or Q5_K.
    pub fn ty(&self) -> GgmlType {
        if self.fifth {
            GgmlType::Q5_K
        } else {
            GgmlType::Q4_K
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (for the memory plan).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` as the file stored it (`out`: the row's bytes, 144 or 176 per super-block).
    pub fn native_row(&self, r: usize, out: &mut [u8]) {
        let (g, rr) = (r / R, r % R);
        let w = self.group(g);
        let native = if self.fifth { Q5K_BYTES } else { Q4K_BYTES };
        let qs_from = native - QK_K / 2;
        for (i, blk) in out.chunks_exact_mut(native).enumerate() {
            let wb = &w[i * block_bytes(self.fifth)..];
            blk[0..2].copy_from_slice(&wb[D_OFF + 2 * rr..D_OFF + 2 * rr + 2]);
            blk[2..4].copy_from_slice(&wb[DMIN_OFF + 2 * rr..DMIN_OFF + 2 * rr + 2]);
            let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
            for sb in 0..4 {
                let (s0, m0, s1, m1) = scales_of(wb, sb, rr);
                (sc[2 * sb], m[2 * sb]) = (s0 as u8, m0 as u8);
                (sc[2 * sb + 1], m[2 * sb + 1]) = (s1 as u8, m1 as u8);
            }
            // The inverse of `scale_min_k4`.
            let q = &mut blk[4..16];
            for j in 0..4 {
                q[j] = sc[j] | (sc[j + 4] >> 4) << 6;
                q[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
                q[j + 8] = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4;
            }
            if self.fifth {
                blk[16..48].fill(0);
            }
            for sb in 0..4 {
                for k in 0..8 {
                    let at = qs_at(self.fifth, sb, k) + 4 * rr;
                    blk[qs_from + 32 * sb + 4 * k..][..4].copy_from_slice(&wb[at..at + 4]);
                    if self.fifth {
                        for e in 0..4 {
                            let (lo, hi) = fifth_bits(wb, sb, k, rr, e);
                            blk[16 + 4 * k + e] |= lo << (2 * sb) | hi << (2 * sb + 1);
                        }
                    }
                }
            }
        }
    }

    fn group(&self, g: usize) -> &[u8] {
        let nb = self.cols / QK_K;
        let gbb = block_bytes(self.fifth);
        &self.data.as_slice()[g * nb * gbb..(g + 1) * nb * gbb]
    }

    /// Rows `16 g .. 16 g + 16` against every activation row (Q8_K rows of `cols`):
    /// `out[t * 16 + r]`. Tokens `t < gemm_upto` take llama.cpp's GEMM order, the rest its GEMV
    /// order (pass `T - T % 4` for a matmul over `T` tokens). With `panel` (the same rows as
    /// A tiles, [`Self::amx_panel`]) the integer sums come from AMX tile products.
    pub fn dot_group(
        &self,
        g: usize,
        acts: &[&[u8]],
        panel: Option<&AmxPanel>,
        gemm_upto: usize,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        let nb = self.cols / QK_K;
        super::check_q8k_group(
            "Q4_K / Q5_K repacked group output",
            g,
            self.rows / R,
            nb,
            acts,
            out,
        )?;
        let w = self.group(g);
        let fifth = self.fifth;
        #[cfg(target_arch = "x86_64")]
        if let Some(panel) = panel.filter(|p| !fifth && p.fits(acts.len(), nb)) {
            super::with_b_tiles(nb * amx_kernel::QUANT_BYTES, |bq| {
                // SAFETY: a panel exists only where AMX (and so AVX-512 VNNI) is available; it
                // holds these `acts` (same count, same `nb`), whose lengths were checked above;
                // `bq` holds `nb` super-blocks of B tiles.
                unsafe { amx_kernel::group(nb, w, acts, panel, gemm_upto, out, bq) };
            });
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx512_available() {
            if acts.len() <= FEW_TOKENS {
                // A few tokens (a verify pass, a small batched decode): straight from the packed
                // scales; the group stays in L1 between the tiles.
                // SAFETY: AVX-512 VNNI is available; every row was length-checked above.
                unsafe {
                    match fifth {
                        false => avx512::tiles::<false, false>(nb, w, null(), acts, gemm_upto, out),
                        true => avx512::tiles::<false, true>(nb, w, null(), acts, gemm_upto, out),
                    }
                }
                return Ok(());
            }
            thread_local! {
                static SCALES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            SCALES.with_borrow_mut(|pre| {
                pre.resize(nb * 256, 0);
                // SAFETY: AVX-512 VNNI is available; `pre` holds `nb * 256` bytes, this
                // group's unpacked scales once `unpack_scales` has run.
                unsafe {
                    avx512::unpack_scales(nb, w, block_bytes(fifth), pre);
                    let pre = pre.as_ptr();
                    match fifth {
                        false => avx512::tiles::<true, false>(nb, w, pre, acts, gemm_upto, out),
                        true => avx512::tiles::<true, true>(nb, w, pre, acts, gemm_upto, out),
                    }
                }
            });
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2_available() {
            // SAFETY: AVX2, FMA and F16C are available (the AVX2 backend needs all three);
            // every row was length-checked above.
            unsafe {
                match fifth {
                    false => avx2::tiles::<false>(nb, w, acts, gemm_upto, out),
                    true => avx2::tiles::<true>(nb, w, acts, gemm_upto, out),
                }
            };
            return Ok(());
        }
        for (t, a) in acts.iter().enumerate() {
            dot_scalar(nb, w, fifth, a, t < gemm_upto, &mut out[t * R..(t + 1) * R]);
        }
        Ok(())
    }
}

impl Q4KRepacked {
    /// The AMX panel of these activation rows ([`AmxPanel::new`]); none for Q5_K (its tiles
    /// run on the VNNI kernels).
    pub fn amx_panel(&self, acts: &[&[u8]]) -> Option<AmxPanel> {
        if self.fifth {
            return None;
        }
        AmxPanel::new(acts, self.cols / QK_K)
    }
}

/// Row r's fifth bits of element `4k + e` of sub-blocks `2 sb` and `2 sb + 1` in a Q5_K group
/// super-block `wb`.
fn fifth_bits(wb: &[u8], sb: usize, k: usize, r: usize, e: usize) -> (u8, u8) {
    let (bit, at) = (4 * r + e, qh_at(sb, k));
    let get = |half: usize| wb[at + 8 * half + bit / 8] >> (bit % 8) & 1;
    (get(0), get(1))
}

/// Row r's (sc_j0, m_j0, sc_j1, m_j1) of sub-block pair `sb` in a group super-block `wb`.
fn scales_of(wb: &[u8], sb: usize, r: usize) -> (i32, i32, i32, i32) {
    let at = SCM_OFF + 3 * R * sb + r;
    let (s, m, h) = (wb[at] as i32, wb[at + R] as i32, wb[at + 2 * R] as i32);
    (
        (s & 15) | (h & 3) << 4,
        (m & 15) | (h >> 4 & 3) << 4,
        s >> 4 | (h >> 2 & 3) << 4,
        m >> 4 | (h >> 6 & 3) << 4,
    )
}

/// The arithmetic of the repacked kernels, one lane at a time: the oracle for the SIMD form
/// (integer sums are exact, the f32 operations the same, so results agree bit for bit).
fn dot_scalar(nb: usize, w: &[u8], fifth: bool, a: &[u8], gemm: bool, out: &mut [f32]) {
    for (r, o) in out.iter_mut().enumerate() {
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for i in 0..nb {
            let wb = &w[i * block_bytes(fifth)..];
            let ab = &a[i * Q8K_BYTES..];
            let yd = f32_at(ab, 0);
            let dyd = f16_at(wb, D_OFF + 2 * r) * yd;
            let dmyd = f16_at(wb, DMIN_OFF + 2 * r) * yd;
            let (mut isum, mut imin) = (0i32, 0i32);
            for sb in 0..4 {
                let mut lo = 0i32;
                let mut hi = 0i32;
                for k in 0..8 {
                    for b in 0..4 {
                        let q = wb[qs_at(fifth, sb, k) + 4 * r + b];
                        let (bl, bh) = if fifth {
                            fifth_bits(wb, sb, k, r, b)
                        } else {
                            (0, 0)
                        };
                        let (ql, qh) = ((q & 0xf) | bl << 4, (q >> 4) | bh << 4);
                        let e = 4 * k + b;
                        lo += ql as i32 * ab[4 + 64 * sb + e] as i8 as i32;
                        hi += qh as i32 * ab[4 + 64 * sb + 32 + e] as i8 as i32;
                    }
                }
                let (j0, j1) = (2 * sb, 2 * sb + 1);
                let (sc0, m0, sc1, m1) = scales_of(wb, sb, r);
                let isb = lo * sc0 + hi * sc1;
                let bsum = |j: usize| i16_at(ab, 260 + 4 * j) + i16_at(ab, 260 + 4 * j + 2);
                let imb = m0 * bsum(j0) + m1 * bsum(j1);
                if gemm {
                    acc = (isb as f32).mul_add(dyd, acc);
                    acc_min = (imb as f32).mul_add(dmyd, acc_min);
                } else {
                    isum += isb;
                    imin += imb;
                }
            }
            if !gemm {
                acc = (isum as f32).mul_add(dyd, acc);
                acc_min = (imin as f32).mul_add(dmyd, acc_min);
            }
        }
        *o = acc - acc_min;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

/// The same group kernels on AVX2 (no AVX-512): eight rows, half a group, at a time, a 32-byte
/// vector holding four consecutive quants of each. Without `vpdpbusd`, `maddubs` gives each
/// row two i16 pair sums a step; a sub-block's eight steps (32 elements) add up in i16
/// (|sum| <= 8 x 2 x 15 x 128 = 30,720) before one `madd` by the rows' scales gives
/// `sc_j (q . y)_j` in i32: the integers of the AVX-512 kernel, and its f32 steps, so the bits
/// are the same. Against the row-major AVX2 kernels (one row, four tokens, a `madd` per
/// `maddubs`), each activation quad is loaded once for eight rows and the scales applied once
/// per sub-block: 2.1x the Q4_K GOPS (1536 columns, 64-512 tokens, AMD EPYC, one core).
#[cfg(target_arch = "x86_64")]
mod avx2;

/// The AMX form of the GEMM. The sub-block scales are folded into the B tiles, so a pair of
/// sub-blocks (64 elements) is three full-depth tile products per 16 tokens x 16 rows, with the
/// activations as A:
/// - `B1 = q * (sc & 15)` and `B2 = q * (sc >> 4)` (both fit u8): `C1 + 16 C2` is the pair's
///   `sc_j0 (q . y)_j0 + sc_j1 (q . y)_j1`;
/// - `Bm = m`, each element's sub-block min: `Cm` is the pair's `m_j0 bsum_j0 + m_j1 bsum_j1`.
///
/// These are the VNNI kernel's integer sums exactly; the f32 steps are its own, per token.
#[cfg(target_arch = "x86_64")]
mod amx_kernel;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repack::testing::{assert_rows_round_trip, Rng};

    #[test]
    fn simd_equals_the_scalar_form_and_the_oracle_dot() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K] {
            check_type(ty);
        }
    }

    /// [`simd_equals_the_scalar_form_and_the_oracle_dot`] for one of the two types.
    fn check_type(ty: GgmlType) {
        let (rows, cols) = (32, 512);
        let mut rng = Rng::new(0x1234_5678_9abc_def0);
        let (w, rb) = rng.matrix(ty, rows, cols);
        let packed = Q4KRepacked::new(ty, &w, rows, cols).unwrap();
        assert_rows_round_trip(&w, rb, |r, out| packed.native_row(r, out));
        let ab = crate::row_bytes(GgmlType::Q8_K, cols).unwrap();
        // Every tile shape: up to 16 tokens, the scales unpacked in the kernel; more: first;
        // from AMX_MIN_TOKENS, through AMX tiles where the CPU has them.
        for t in [1usize, 2, 3, 4, 6, 7, 9, 14, 16, 19, 25, 32, 35, 50] {
            let acts = rng.acts(GgmlType::Q8_K, t, cols);
            // Each row its own allocation (rows need not be evenly spaced).
            let owned: Vec<Vec<u8>> = acts.chunks_exact(ab).map(|r| r.to_vec()).collect();
            let act_rows: Vec<&[u8]> = owned.iter().map(|r| r.as_slice()).collect();
            let gemm_upto = t - t % 4;
            let panel = packed.amx_panel(&act_rows);
            let amx = t >= super::super::AMX_MIN_TOKENS
                && crate::amx::available()
                && ty == GgmlType::Q4_K;
            assert_eq!(panel.is_some(), amx, "{t} tokens");
            for g in 0..rows / R {
                let mut got = vec![0f32; t * R];
                packed
                    .dot_group(g, &act_rows, panel.as_ref(), gemm_upto, &mut got)
                    .unwrap();
                if amx && g == 0 {
                    // A panel built for other rows is ignored (the kernels without it run).
                    let fewer = &act_rows[..t - 1];
                    let upto = (t - 1) - (t - 1) % 4;
                    let (mut with, mut without) =
                        (vec![0f32; (t - 1) * R], vec![0f32; (t - 1) * R]);
                    packed
                        .dot_group(g, fewer, panel.as_ref(), upto, &mut with)
                        .unwrap();
                    packed
                        .dot_group(g, fewer, None, upto, &mut without)
                        .unwrap();
                    assert!(with
                        .iter()
                        .zip(&without)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                let mut want = vec![0f32; t * R];
                for (c, a) in act_rows.iter().enumerate() {
                    dot_scalar(
                        cols / QK_K,
                        packed.group(g),
                        ty == GgmlType::Q5_K,
                        a,
                        c < gemm_upto,
                        &mut want[c * R..(c + 1) * R],
                    );
                }
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "group {g} token {} row {}",
                        i / R,
                        i % R
                    );
                }
                // Same value as the row-major oracle, up to f32 rounding order.
                for c in 0..t {
                    for r in 0..R {
                        let row = &w[(g * R + r) * rb..(g * R + r + 1) * rb];
                        let o = crate::dot::generic::vec_dot(ty, cols, row, act_rows[c]);
                        let v = got[c * R + r];
                        assert!((o - v).abs() <= 1e-3 * (1.0 + o.abs()), "{ty}: {o} vs {v}");
                    }
                }
            }
        }
        assert!(Q4KRepacked::new(ty, &w[..rb * 8], 8, cols).is_err());
    }

    /// The AVX2 kernels against the scalar form, bit for bit, on any CPU with AVX2 (whichever
    /// backend this process detected): every tile shape and split between the orders.
    #[test]
    fn the_avx2_kernels_equal_the_scalar_form() {
        #[cfg(target_arch = "x86_64")]
        {
            if !crate::cpu::Backend::Avx2.is_available() {
                eprintln!("skipped: no AVX2 / FMA / F16C on this CPU");
                return;
            }
            for ty in [GgmlType::Q4_K, GgmlType::Q5_K] {
                avx2_case(ty);
            }
        }
    }

    /// [`the_avx2_kernels_equal_the_scalar_form`] for one of the two types.
    #[cfg(target_arch = "x86_64")]
    fn avx2_case(ty: GgmlType) {
        let fifth = ty == GgmlType::Q5_K;
        let (rows, cols) = (32, 768);
        let mut rng = Rng::new(0xa5a5_0002);
        let (w, _) = rng.matrix(ty, rows, cols);
        let mut packed = Q4KRepacked::new(ty, &w, rows, cols).unwrap();
        let ab = crate::row_bytes(GgmlType::Q8_K, cols).unwrap();
        let nb = cols / QK_K;
        let cases = [
            (1, 0),
            (2, 0),
            (3, 0),
            (4, 4),
            (4, 0),
            (7, 4),
            (9, 8),
            (6, 5),
            (13, 2),
        ];
        // Random weights, then the i16 sums at their largest: every level 15 (Q5_K: 31)
        // against activations of +127 (tokens 0, 2, ..) and -127 (tokens 1, 3, ..).
        for extreme in [false, true] {
            if extreme {
                for blk in packed
                    .data
                    .as_mut_slice()
                    .chunks_exact_mut(block_bytes(fifth))
                {
                    blk[QS_OFF..].fill(0xff);
                }
            }
            for (t, gemm_upto) in cases {
                let mut acts = rng.acts(GgmlType::Q8_K, t, cols);
                if extreme {
                    for (c, row) in acts.chunks_exact_mut(ab).enumerate() {
                        for blk in row.chunks_exact_mut(Q8K_BYTES) {
                            blk[4..260].fill(if c % 2 == 0 { 127 } else { 0x81 });
                        }
                    }
                }
                let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
                for g in 0..rows / R {
                    let mut got = vec![0f32; t * R];
                    let w = packed.group(g);
                    // SAFETY: AVX2, FMA and F16C checked by the caller; rows of `nb` Q8_K
                    // blocks.
                    unsafe {
                        match fifth {
                            false => avx2::tiles::<false>(nb, w, &act_rows, gemm_upto, &mut got),
                            true => avx2::tiles::<true>(nb, w, &act_rows, gemm_upto, &mut got),
                        }
                    }
                    for (c, a) in act_rows.iter().enumerate() {
                        let mut want = [0f32; R];
                        dot_scalar(nb, w, fifth, a, c < gemm_upto, &mut want);
                        for r in 0..R {
                            assert_eq!(
                                got[c * R + r].to_bits(),
                                want[r].to_bits(),
                                "{ty} {t} tokens, GEMM order up to {gemm_upto}, extreme \
                                 {extreme}: group {g} token {c} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn any_split_between_the_orders_equals_the_scalar_form() {
        let (rows, cols) = (16, 512);
        let mut rng = Rng::new(0x0dd5_1175);
        let (w, _) = rng.matrix(GgmlType::Q4_K, rows, cols);
        let packed = Q4KRepacked::new(GgmlType::Q4_K, &w, rows, cols).unwrap();
        let ab = crate::row_bytes(GgmlType::Q8_K, cols).unwrap();
        // Splits that are not a multiple of 4 (no tile of their own), few tokens and many.
        for (t, gemm_upto) in [(3, 1), (6, 5), (9, 2), (13, 13), (19, 10), (21, 7)] {
            let acts = rng.acts(GgmlType::Q8_K, t, cols);
            let act_rows: Vec<&[u8]> = acts.chunks_exact(ab).collect();
            let mut got = vec![0f32; t * R];
            packed
                .dot_group(0, &act_rows, None, gemm_upto, &mut got)
                .unwrap();
            for (c, a) in act_rows.iter().enumerate() {
                let mut want = [0f32; R];
                dot_scalar(
                    cols / QK_K,
                    packed.group(0),
                    false,
                    a,
                    c < gemm_upto,
                    &mut want,
                );
                for r in 0..R {
                    assert_eq!(
                        got[c * R + r].to_bits(),
                        want[r].to_bits(),
                        "{t}/{gemm_upto}"
                    );
                }
            }
        }
    }
}
