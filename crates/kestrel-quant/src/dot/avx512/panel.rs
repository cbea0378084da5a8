//! Prefill over the 32-element block types: weight rows decoded once into a [`Panel`] for a
//! whole batch of activation rows, then register tiles of rows x tokens.

use super::*;
use crate::dot::q32::PrefillPanel;

/// Weight rows of a 32-element block type decoded once for a whole batch of activation rows,
/// in quads of four rows: per row and block the signed quants (32 bytes: `q - 8`, `q - 16`,
/// `q`; Q4_1's and Q5_1's `q` as is) and the `vpdpbusd` seed `-128 * (sum of each 4 quants)` that undoes
/// the activations' `+ 128` (they enter as the unsigned operand); per quad and block the four
/// rows' scales, each repeated four times (lane `4r + c`, ready to multiply by four tokens'
/// scales); per row and block (Q4_1, Q5_1) the min. Integer sums are exact, so this equals the
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

impl PrefillPanel for Panel {
    const TOKENS: usize = 4;

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
        panel_fill(w, nb, x, self)
    }

    unsafe fn tile(
        &mut self,
        w: GgmlType,
        nb: usize,
        q: usize,
        y: [*const u8; 4],
        dyt: *const f32,
    ) -> [f32; 16] {
        panel_tile(w, nb, self, q, y, dyt)
    }
}

/// Decodes rows `x` (1..=8) into `panel`, as `ceil(len / 4)` quads.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn panel_fill(w: GgmlType, nb: usize, x: &[*const u8], panel: &mut Panel) {
    match w {
        GgmlType::Q4_0 => panel_fill_t::<Q4_0>(nb, x, panel),
        GgmlType::Q5_0 => panel_fill_t::<Q5_0>(nb, x, panel),
        GgmlType::Q8_0 => panel_fill_t::<Q8_0>(nb, x, panel),
        GgmlType::Q5_1 => panel_fill_t::<Q5_1>(nb, x, panel),
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
                if with_min(T) {
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

/// Four activation rows against quad `q` of a filled [`Panel`]: `[token][row]`, the same
/// arithmetic as [`matvec_pre`] per row and token (bit for bit). `dyt` holds the four tokens'
/// block scales as f32, transposed: `dyt[4 * block + c]`.
///
/// One 8-lane accumulator per row and token, as llama.cpp's: per block and pair of them, a
/// `vpdpbusd` from the seed, a convert and an FMA whose scale `dx * dy` comes broadcast from
/// memory (sixteen products made by one 16-lane multiply per block), so the FP pipes do three
/// 256-bit ops per 32 products.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn panel_tile(
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
        GgmlType::Q5_1 => panel_tile_t::<Q5_1>(nb, panel, q, y, dyt),
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
    let qoff = if with_min(T) { 4 } else { 2 };
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    // Q4_1's and Q5_1's m . sy per token and row, `[token][row]` (lane 4c + r, as the
    // reduction's).
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
