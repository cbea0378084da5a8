//! x86 kernels shared by the AVX2 and AVX-512 backends.
//!
//! Every kernel is written once, in [`x86_kernels!`], over a const `N`: it decodes one weight
//! block into registers and dots it against `N` activation rows before moving on, so batched
//! prefill pays the unpacking (nibble split, 6-bit scale shuffle) once per weight block rather
//! than once per token. `N = 1` is the decode matvec. The two backends differ only in the
//! feature set and, for the 32-element types, in the u8 x i8 -> i32 step (`maddubs + madd` on
//! AVX2, `vpdpbusd` with VNNI); the K-quant kernels (Q2_K to Q6_K) take `maddubs` then a `madd`
//! by their sub-block scales on both.
//!
//! Integer sums are exactly the scalar oracle's. The f32 order of the 32-element block types is
//! llama.cpp's AVX2 one (8 lanes of i32 sums of four, `acc = fma(dx * dy, lanes, acc)` per
//! block, `hsum8`, then Q4_1's and Q5_1's `summs = fma(m, s, summs)`), so those dots equal its
//! bit for bit (Q5_1: as llama.cpp's Q4_1);
//! the K-quant kernels keep their own order.

#[cfg(target_arch = "x86")]
pub(crate) use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
pub(crate) use std::arch::x86_64::*;

/// Load a `ggml_half` at `p` and widen it (F16C).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn fp16(p: *const u8) -> f32 {
    // In asm: from intrinsics (`set1`, `cvtsi32_si128`, `loadu_si16` alike) LLVM emits a
    // `vpinsrw` that merges into whatever register it likes, often a loop's accumulator: a
    // false dependency that chained every block behind the previous block's FMA (13-17 cycles
    // a block in the Q*_0 kernels). `vmovd` from a general register writes the whole register.
    let h = (p as *const u16).read_unaligned() as u32;
    let x: __m128;
    std::arch::asm!(
        "vmovd {x}, {h:e}",
        "vcvtph2ps {x}, {x}",
        h = in(reg) h,
        x = out(xmm_reg) x,
        options(pure, nomem, nostack, preserves_flags),
    );
    _mm_cvtss_f32(x)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn hsum8(x: __m256) -> f32 {
    hsum4(_mm_add_ps(
        _mm256_extractf128_ps::<1>(x),
        _mm256_castps256_ps128(x),
    ))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn hsum4(x: __m128) -> f32 {
    let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..16) then high (16..32).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 32 bits (LE u32 at `p`) -> 32 bytes, 0xff where the bit is set.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let bits = (p as *const u32).read_unaligned() as i32;
    // Byte j takes source byte j / 8, then is tested against bit j % 8.
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// u8 x i8 pair products summed in fours into i32 lanes, the AVX2 way. |a| <= 255, |b| <= 128
/// with at most one factor at a bound, so the i16 intermediate never saturates for our inputs.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot_u8i8_avx2(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

macro_rules! x86_kernels {
    ($feat:literal, $dot:ident) => {
        use super::x86::*;
        use kestrel_gguf::GgmlType;

        /// Dot `nb` weight blocks at `x` against `N` activation rows. None: no kernel for `w`.
        ///
        /// # Safety
        /// The CPU has this backend's features; `x` and each `y[c]` point at whole rows of `nb`
        /// blocks of `w` / `vec_dot_type(w)`.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot<const N: usize>(
            w: GgmlType,
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> Option<[f32; N]> {
            Some(match w {
                GgmlType::Q4_0 => q4_0_q8_0::<N>(nb, x, y),
                GgmlType::Q4_1 => min_q8_1::<N, false>(nb, x, y),
                GgmlType::Q5_1 => min_q8_1::<N, true>(nb, x, y),
                GgmlType::Q5_0 => q5_0_q8_0::<N>(nb, x, y),
                GgmlType::Q8_0 => q8_0_q8_0::<N>(nb, x, y),
                GgmlType::Q2_K => q2_k_q8_k::<N>(nb, x, y),
                GgmlType::Q3_K => q3_k_q8_k::<N>(nb, x, y),
                GgmlType::Q4_K => k_scale_min::<N, false>(nb, x, y),
                GgmlType::Q5_K => k_scale_min::<N, true>(nb, x, y),
                GgmlType::Q6_K => q6_k_q8_k::<N>(nb, x, y),
                _ => return None,
            })
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn finish<const N: usize>(acc: [__m256; N], add: [f32; N]) -> [f32; N] {
            let mut out = [0f32; N];
            for c in 0..N {
                out[c] = hsum8(acc[c]) + add[c];
            }
            out
        }

        /// The f16 at `p + k * stride` for `k` in 0..8, widened in one conversion.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn fp16x8(p: *const u8, stride: usize) -> __m256 {
            let h = |k: usize| (p.add(k * stride) as *const i16).read_unaligned();
            _mm256_cvtph_ps(_mm_setr_epi16(
                h(0),
                h(1),
                h(2),
                h(3),
                h(4),
                h(5),
                h(6),
                h(7),
            ))
        }

        /// Per activation row, `dx * dy` of the blocks `i..i + n` (n <= 8): the f16 scales at
        /// byte `xo` of `xs`-byte weight blocks and byte 0 of `ys`-byte activation blocks,
        /// converted eight at a time (the products equal the scalar `fp16(x) * fp16(y)`).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn scale_products<const N: usize>(
            x: *const u8,
            xs: usize,
            xo: usize,
            y: &[*const u8; N],
            ys: usize,
            i: usize,
            n: usize,
        ) -> [[f32; 8]; N] {
            let mut d = [[0f32; 8]; N];
            if n == 8 {
                let dx = fp16x8(x.add(i * xs + xo), xs);
                for c in 0..N {
                    let dy = fp16x8(y[c].add(i * ys), ys);
                    _mm256_storeu_ps(d[c].as_mut_ptr(), _mm256_mul_ps(dx, dy));
                }
            } else {
                for k in 0..n {
                    let dx = fp16(x.add((i + k) * xs + xo));
                    for c in 0..N {
                        d[c][k] = dx * fp16(y[c].add((i + k) * ys));
                    }
                }
            }
            d
        }

        /// Signed i8 weights `qx` (|q| <= 127 or activations without -128) against Q8 blocks
        /// with 32 quants at `y[c] + at + 2`, scaled by `d[c]`: sign trick, so the unsigned
        /// operand is |qx|.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn signed_blocks<const N: usize>(
            acc: &mut [__m256; N],
            d: [f32; N],
            qx: __m256i,
            y: &[*const u8; N],
            at: usize,
        ) {
            let ax = _mm256_sign_epi8(qx, qx);
            for c in 0..N {
                let qy = _mm256_loadu_si256(y[c].add(at + 2) as *const __m256i);
                let s = $dot(ax, _mm256_sign_epi8(qy, qx));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d[c]), _mm256_cvtepi32_ps(s), acc[c]);
            }
        }

        /// A 32-element weight type of `xs`-byte blocks (f16 scale first) against Q8_0 rows:
        /// `unpack(block)` gives the signed quants, then [`signed_blocks`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn signed_q8_0<const N: usize>(
            nb: usize,
            x: *const u8,
            xs: usize,
            y: [*const u8; N],
            unpack: impl Fn(*const u8) -> __m256i,
        ) -> [f32; N] {
            let mut acc = [_mm256_setzero_ps(); N];
            let mut i = 0;
            while i < nb {
                let n = (nb - i).min(8);
                let d = scale_products(x, xs, 0, &y, 34, i, n);
                for k in 0..n {
                    let qx = unpack(x.add((i + k) * xs));
                    signed_blocks(
                        &mut acc,
                        std::array::from_fn(|c| d[c][k]),
                        qx,
                        &y,
                        (i + k) * 34,
                    );
                }
                i += n;
            }
            finish(acc, [0.0; N])
        }

        /// Q4_0 (18 B: d, 16 nibble bytes) x Q8_0 (34 B: d, 32 x i8).
        #[target_feature(enable = $feat)]
        unsafe fn q4_0_q8_0<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            let off = _mm256_set1_epi8(8);
            signed_q8_0(nb, x, 18, y, |xb| {
                _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(2)), off)
            })
        }

        /// Q5_0 (22 B: d, qh u32, 16 nibble bytes) x Q8_0: q - 16 is the nibble with 0xf0 OR-ed
        /// in where the fifth bit is clear.
        #[target_feature(enable = $feat)]
        unsafe fn q5_0_q8_0<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            let hi = _mm256_set1_epi8(0xf0u8 as i8);
            signed_q8_0(nb, x, 22, y, |xb| {
                let bxhi = _mm256_andnot_si256(bytes_from_bits_32(xb.add(2)), hi);
                _mm256_or_si256(bytes_from_nibbles_32(xb.add(6)), bxhi)
            })
        }

        /// Q8_0 x Q8_0 (weights from llama.cpp's quantizer never hold -128).
        #[target_feature(enable = $feat)]
        unsafe fn q8_0_q8_0<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            signed_q8_0(nb, x, 34, y, |xb| {
                _mm256_loadu_si256(xb.add(2) as *const __m256i)
            })
        }

        /// Q4_1 (20 B: d, m, 16 nibble bytes) x Q8_1 (36 B: d, s = d * sum q, 32 x i8): the
        /// min folds in as m * s per block. With `FIFTH`, Q5_1 (24 B: d, m, qh u32, 16 nibble
        /// bytes): the same steps over 5-bit levels (16 added where the fifth bit is set).
        #[inline(always)]
        unsafe fn min_q8_1<const N: usize, const FIFTH: bool>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            let (xs, qs) = if FIFTH { (24, 8) } else { (20, 4) };
            let mut acc = [_mm256_setzero_ps(); N];
            let mut summs = [0f32; N];
            let mut i = 0;
            while i < nb {
                let n = (nb - i).min(8);
                let d = scale_products(x, xs, 0, &y, 36, i, n);
                let mut mx = [0f32; 8];
                let mut sy = [[0f32; 8]; N];
                if n == 8 {
                    _mm256_storeu_ps(mx.as_mut_ptr(), fp16x8(x.add(i * xs + 2), xs));
                    for c in 0..N {
                        _mm256_storeu_ps(sy[c].as_mut_ptr(), fp16x8(y[c].add(i * 36 + 2), 36));
                    }
                } else {
                    for k in 0..n {
                        mx[k] = fp16(x.add((i + k) * xs + 2));
                        for c in 0..N {
                            sy[c][k] = fp16(y[c].add((i + k) * 36 + 2));
                        }
                    }
                }
                for k in 0..n {
                    let xb = x.add((i + k) * xs);
                    let mut qx = bytes_from_nibbles_32(xb.add(qs));
                    if FIFTH {
                        let bit = bytes_from_bits_32(xb.add(4));
                        qx = _mm256_or_si256(qx, _mm256_and_si256(bit, _mm256_set1_epi8(16)));
                    }
                    for c in 0..N {
                        summs[c] = mx[k].mul_add(sy[c][k], summs[c]);
                        let qy = _mm256_loadu_si256(y[c].add((i + k) * 36 + 4) as *const __m256i);
                        let s = $dot(qx, qy);
                        acc[c] =
                            _mm256_fmadd_ps(_mm256_set1_ps(d[c][k]), _mm256_cvtepi32_ps(s), acc[c]);
                    }
                }
                i += n;
            }
            finish(acc, summs)
        }

        /// Q4_K (144 B: d, dmin, 12 B scales, 128 B nibbles) x Q8_K (292 B: f32 d, 256 x i8,
        /// 16 x i16 bsums). Per super-block: sum_j sc_j * (q4 . q8)_j - dmin * sum_j m_j *
        /// bsum_j, one 8-lane i32 sum per super-block and token scaled by `d * dy`. With
        /// `FIFTH`, Q5_K (176 B: d, dmin, 12 B scales, 32 B fifth bits, 128 B nibbles): the
        /// same sums over 5-bit levels (`q + 16 * bit`; at most 31 x 2 x 128 a `maddubs` pair).
        #[inline(always)]
        unsafe fn k_scale_min<const N: usize, const FIFTH: bool>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            const KMASK1: u32 = 0x3f3f3f3f;
            const KMASK2: u32 = 0x0f0f0f0f;
            const KMASK3: u32 = 0x03030303;
            let m4 = _mm256_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); N];
            let mut acc_m = [_mm_setzero_ps(); N];
            let (block, qs) = if FIFTH { (176, 48) } else { (144, 16) };
            let sixteen = _mm256_set1_epi8(16);
            for i in 0..nb {
                let xb = x.add(i * block);
                let (d, dmin) = (fp16(xb), fp16(xb.add(2)));
                // Q5_K: element l of sub-block s has its fifth bit at bit s of byte l.
                let fifth = _mm256_loadu_si256(xb.add(16) as *const __m256i);
                // 12 packed bytes -> 8 scales then 8 mins, one byte each.
                let sp = xb.add(4) as *const u32;
                let mut u = [
                    sp.read_unaligned(),
                    sp.add(1).read_unaligned(),
                    sp.add(2).read_unaligned(),
                    0,
                ];
                u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
                let uaux = u[1] & KMASK1;
                u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
                u[2] = uaux;
                u[0] &= KMASK1;
                let mins_scales = _mm256_cvtepu8_epi16(_mm_set_epi32(
                    u[3] as i32,
                    u[2] as i32,
                    u[1] as i32,
                    u[0] as i32,
                ));
                let mins = _mm256_extracti128_si256::<1>(mins_scales);
                let sc128 = _mm256_castsi256_si128(mins_scales);
                let scales = _mm256_set_m128i(sc128, sc128);

                let mut yd = [0f32; N];
                let mut sumi = [_mm256_setzero_si256(); N];
                for c in 0..N {
                    let yb = y[c].add(i * 292);
                    yd[c] = (yb as *const f32).read_unaligned();
                    let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
                    let q8s = _mm_hadd_epi16(
                        _mm256_castsi256_si128(bsums),
                        _mm256_extracti128_si256::<1>(bsums),
                    );
                    let prod = _mm_madd_epi16(mins, q8s);
                    acc_m[c] =
                        _mm_fmadd_ps(_mm_set1_ps(-yd[c] * dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
                }
                for j in 0..4 {
                    // Broadcast i16 scale 2j (low nibbles) and 2j + 1 (high nibbles).
                    let lo = (2 * j) as i16 * 2;
                    let scale_l =
                        _mm256_shuffle_epi8(scales, _mm256_set1_epi16(((lo + 1) << 8) | lo));
                    let scale_h =
                        _mm256_shuffle_epi8(scales, _mm256_set1_epi16(((lo + 3) << 8) | (lo + 2)));
                    let bits = _mm256_loadu_si256(xb.add(qs + 32 * j) as *const __m256i);
                    let mut q4l = _mm256_and_si256(bits, m4);
                    let mut q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    if FIFTH {
                        // Bits 2j and 2j + 1 of every byte moved to bit 4 (16-bit shifts by
                        // the same count keep each byte's bits in that byte).
                        let shifted = |s: i32| match s {
                            0 => _mm256_slli_epi16::<4>(fifth),
                            1 => _mm256_slli_epi16::<3>(fifth),
                            2 => _mm256_slli_epi16::<2>(fifth),
                            3 => _mm256_slli_epi16::<1>(fifth),
                            4 => fifth,
                            5 => _mm256_srli_epi16::<1>(fifth),
                            6 => _mm256_srli_epi16::<2>(fifth),
                            _ => _mm256_srli_epi16::<3>(fifth),
                        };
                        let hl = _mm256_and_si256(shifted(2 * j as i32), sixteen);
                        let hh = _mm256_and_si256(shifted(2 * j as i32 + 1), sixteen);
                        q4l = _mm256_or_si256(q4l, hl);
                        q4h = _mm256_or_si256(q4h, hh);
                    }
                    for c in 0..N {
                        let q8 = y[c].add(i * 292 + 4 + 64 * j);
                        let q8l = _mm256_loadu_si256(q8 as *const __m256i);
                        let q8h = _mm256_loadu_si256(q8.add(32) as *const __m256i);
                        let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                        let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(pl, ph));
                    }
                }
                scale_sums(&mut acc, d, &yd, &sumi);
            }
            let mut mins = [0f32; N];
            for c in 0..N {
                mins[c] = hsum4(acc_m[c]);
            }
            finish(acc, mins)
        }

        /// `sumi[c] += sc * (q . y)` in i16 pairs (`maddubs`, then `madd` by the sub-block
        /// scales `sc`), the quants of token c at byte `at` of its row.
        #[inline(always)]
        unsafe fn scaled_sums<const N: usize>(
            sumi: &mut [__m256i; N],
            sc: __m256i,
            q: __m256i,
            y: &[*const u8; N],
            at: usize,
        ) {
            for c in 0..N {
                let q8 = _mm256_loadu_si256(y[c].add(at) as *const __m256i);
                let p = _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, q8));
                sumi[c] = _mm256_add_epi32(sumi[c], p);
            }
        }

        /// A super-block's i32 sums into the accumulators: `acc[c] += d * yd[c] * sumi[c]`.
        #[inline(always)]
        unsafe fn scale_sums<const N: usize>(
            acc: &mut [__m256; N],
            d: f32,
            yd: &[f32; N],
            sumi: &[__m256i; N],
        ) {
            for c in 0..N {
                acc[c] = _mm256_fmadd_ps(
                    _mm256_set1_ps(d * yd[c]),
                    _mm256_cvtepi32_ps(sumi[c]),
                    acc[c],
                );
            }
        }

        /// The i16 scale of 16-element sub-block `s` in lanes 0..8 and of `s + 1` in lanes
        /// 8..16, from 16 scale bytes (signed with `SIGNED`): `maddubs` lanes 0..8 hold
        /// elements 0..16 of a 32-element run, lanes 8..16 the next 16.
        #[inline(always)]
        unsafe fn scale_pair16<const SIGNED: bool>(scales: __m128i, s: usize) -> __m256i {
            let s = s as i64;
            let pick = _mm_set_epi64x((s + 1) * 0x0101010101010101, s * 0x0101010101010101);
            let b = _mm_shuffle_epi8(scales, pick);
            if SIGNED {
                _mm256_cvtepi8_epi16(b)
            } else {
                _mm256_cvtepu8_epi16(b)
            }
        }

        /// 2-bit field `k` (bits 2k, 2k + 1) of every byte of `bits`.
        #[inline(always)]
        unsafe fn crumb(bits: __m256i, k: usize) -> __m256i {
            let m3 = _mm256_set1_epi8(3);
            match k {
                0 => _mm256_and_si256(bits, m3),
                1 => _mm256_and_si256(_mm256_srli_epi16::<2>(bits), m3),
                2 => _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m3),
                _ => _mm256_and_si256(_mm256_srli_epi16::<6>(bits), m3),
            }
        }

        /// Q2_K (84 B: 16 bytes of 4-bit scale | 4-bit min, 64 B of 2-bit quants, d, dmin) x
        /// Q8_K. Per super-block: `sum_j sc_j (q . y)_j` over its 16-element sub-blocks, less
        /// `dmin / d` times `sum_j m_j bsum_j`. Element `128 n + 32 k + l` is field k of quant
        /// byte `32 n + l`, in sub-block `8 n + 2 k` (l < 16) or the next.
        #[target_feature(enable = $feat)]
        unsafe fn q2_k_q8_k<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            let m4 = _mm_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); N];
            let mut acc_m = [_mm256_setzero_ps(); N];
            for i in 0..nb {
                let xb = x.add(i * 84);
                let (d, dmin) = (fp16(xb.add(80)), fp16(xb.add(82)));
                let sm = _mm_loadu_si128(xb as *const __m128i);
                let scales = _mm_and_si128(sm, m4);
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sm), m4));
                let mut yd = [0f32; N];
                let mut sumi = [_mm256_setzero_si256(); N];
                for c in 0..N {
                    let yb = y[c].add(i * 292);
                    yd[c] = (yb as *const f32).read_unaligned();
                    let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
                    let prod = _mm256_madd_epi16(mins, bsums);
                    acc_m[c] = _mm256_fmadd_ps(
                        _mm256_set1_ps(dmin * yd[c]),
                        _mm256_cvtepi32_ps(prod),
                        acc_m[c],
                    );
                }
                for n in 0..2 {
                    let bits = _mm256_loadu_si256(xb.add(16 + 32 * n) as *const __m256i);
                    for k in 0..4 {
                        let q = crumb(bits, k);
                        let sc = scale_pair16::<false>(scales, 8 * n + 2 * k);
                        scaled_sums(&mut sumi, sc, q, &y, i * 292 + 4 + 128 * n + 32 * k);
                    }
                }
                scale_sums(&mut acc, d, &yd, &sumi);
            }
            let mut mins = [0f32; N];
            for c in 0..N {
                mins[c] = -hsum8(acc_m[c]);
            }
            finish(acc, mins)
        }

        /// Q3_K (110 B: 32 B of high bits, 64 B of 2-bit quants, 12 B of packed 6-bit scales,
        /// d) x Q8_K. Level `q2 + 4 h` (0..7, `h` the high bit) stands for `q2 + 4 h - 4`, so
        /// per super-block: `sum_j s_j (q . y)_j - 4 sum_j s_j bsum_j` with `s_j = scale_j -
        /// 32`; elements as Q2_K's, the high bit of element `128 n + 32 k + l` at bit `4 n +
        /// k` of byte l.
        #[target_feature(enable = $feat)]
        unsafe fn q3_k_q8_k<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            const KMASK1: u32 = 0x03030303;
            const KMASK2: u32 = 0x0f0f0f0f;
            let four = _mm256_set1_epi8(4);
            let mut acc = [_mm256_setzero_ps(); N];
            for i in 0..nb {
                let xb = x.add(i * 110);
                let d = fp16(xb.add(108));
                // 12 packed bytes -> 16 six-bit scales, one byte each (llama.cpp's unpacking).
                let sp = xb.add(96) as *const u32;
                let a = [
                    sp.read_unaligned(),
                    sp.add(1).read_unaligned(),
                    sp.add(2).read_unaligned(),
                ];
                let u = [
                    (a[0] & KMASK2) | ((a[2] & KMASK1) << 4),
                    (a[1] & KMASK2) | (((a[2] >> 2) & KMASK1) << 4),
                    ((a[0] >> 4) & KMASK2) | (((a[2] >> 4) & KMASK1) << 4),
                    ((a[1] >> 4) & KMASK2) | (((a[2] >> 6) & KMASK1) << 4),
                ];
                let scales = _mm_sub_epi8(
                    _mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32),
                    _mm_set1_epi8(32),
                );
                let sc16 = _mm256_cvtepi8_epi16(scales);
                let hbits = _mm256_loadu_si256(xb as *const __m256i);
                let mut yd = [0f32; N];
                let mut sumi = [_mm256_setzero_si256(); N];
                for c in 0..N {
                    let yb = y[c].add(i * 292);
                    yd[c] = (yb as *const f32).read_unaligned();
                    let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
                    let corr = _mm256_madd_epi16(sc16, bsums);
                    sumi[c] = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32::<2>(corr));
                }
                for n in 0..2 {
                    let bits = _mm256_loadu_si256(xb.add(32 + 32 * n) as *const __m256i);
                    for k in 0..4 {
                        // Bit 4n + k of every byte moved to bit 2 (16-bit shifts by one count
                        // keep each byte's bits in that byte).
                        let h = match 4 * n + k {
                            0 => _mm256_slli_epi16::<2>(hbits),
                            1 => _mm256_slli_epi16::<1>(hbits),
                            2 => hbits,
                            3 => _mm256_srli_epi16::<1>(hbits),
                            4 => _mm256_srli_epi16::<2>(hbits),
                            5 => _mm256_srli_epi16::<3>(hbits),
                            6 => _mm256_srli_epi16::<4>(hbits),
                            _ => _mm256_srli_epi16::<5>(hbits),
                        };
                        let q = _mm256_or_si256(crumb(bits, k), _mm256_and_si256(h, four));
                        let sc = scale_pair16::<true>(scales, 8 * n + 2 * k);
                        scaled_sums(&mut sumi, sc, q, &y, i * 292 + 4 + 128 * n + 32 * k);
                    }
                }
                scale_sums(&mut acc, d, &yd, &sumi);
            }
            finish(acc, [0.0; N])
        }

        /// Q6_K (210 B: 128 B low nibbles, 64 B high 2-bit pairs, 16 x i8 scales, d) x Q8_K.
        /// q is 0..63 unsigned; the -32 offset folds in once per super-block through bsums:
        /// sum_j sc_j * (q . q8)_j - 32 * sum_j sc_j * bsum_j.
        #[target_feature(enable = $feat)]
        unsafe fn q6_k_q8_k<const N: usize>(
            nb: usize,
            x: *const u8,
            y: [*const u8; N],
        ) -> [f32; N] {
            let m4 = _mm256_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); N];
            for i in 0..nb {
                let xb = x.add(i * 210);
                let d = fp16(xb.add(208));
                let scales = _mm_loadu_si128(xb.add(192) as *const __m128i);
                let sc16 = _mm256_cvtepi8_epi16(scales);
                let mut yd = [0f32; N];
                let mut sumi = [_mm256_setzero_si256(); N];
                for c in 0..N {
                    let yb = y[c].add(i * 292);
                    yd[c] = (yb as *const f32).read_unaligned();
                    let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
                    let corr = _mm256_madd_epi16(sc16, bsums);
                    sumi[c] = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32::<5>(corr));
                }
                for j in 0..2 {
                    let bits1 = _mm256_loadu_si256(xb.add(64 * j) as *const __m256i);
                    let bits2 = _mm256_loadu_si256(xb.add(64 * j + 32) as *const __m256i);
                    let bh = _mm256_loadu_si256(xb.add(128 + 32 * j) as *const __m256i);
                    for k in 0..4 {
                        let low = match k {
                            0 => _mm256_and_si256(bits1, m4),
                            1 => _mm256_and_si256(bits2, m4),
                            2 => _mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m4),
                            _ => _mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m4),
                        };
                        let high = crumb(bh, k);
                        let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
                        let sc = scale_pair16::<true>(scales, 2 * (4 * j + k));
                        scaled_sums(&mut sumi, sc, q, &y, i * 292 + 4 + 128 * j + 32 * k);
                    }
                }
                scale_sums(&mut acc, d, &yd, &sumi);
            }
            finish(acc, [0.0; N])
        }
    };
}
pub(crate) use x86_kernels;
