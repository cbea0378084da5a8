//! llama.cpp's one-query flash attention over an f16 cache (decode and short prompts), operation
//! for operation, so their tokens are llama.cpp's bit for bit.

use super::*;

/// llama.cpp's one-query flash attention over an f16 cache
/// (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`), operation for operation: q rounded to
/// f16; each score a 4 x 16-lane f32 FMA dot reduced in GCC's `_mm512_reduce_add_ps` order;
/// the online softmax one position at a time with libm's `expf`; the V accumulator in f16,
/// rescaled and fused-multiply-added (then rounded) per position; the sum `S = fma(S, ms, vs)`.
/// Decode and short prompts go through this, so their tokens are llama.cpp's bit for bit.
pub(super) fn attend_group_f16_ggml(
    qg: &[f32],
    rows: &Rows,
    span: &Span,
    scale: f32,
    out: &mut [f32],
    single: bool,
) {
    let d = rows.head_dim;
    // A lone query past 256 cached positions: llama.cpp splits the (256-padded) range in two
    // halves (one per thread of the 2-thread runs the references come from), then merges.
    let padded = span.n_pos.next_multiple_of(256);
    if single && padded >= 512 {
        let half = padded / 2;
        let lo = Span {
            n_pos: half.min(span.n_pos),
            ..*span
        };
        let hi = Span {
            first: half,
            ..*span
        };
        let a = ggml_partial(qg, rows, &lo, scale);
        let b = ggml_partial(qg, rows, &hi, scale);
        for h in 0..qg.len() / d {
            let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
            let dst = &mut out[h * d..(h + 1) * d];
            dst.fill(0.0);
            for part in [&a, &b] {
                if part.sum[h] == 0.0 {
                    continue;
                }
                let m_new = m.max(part.max[h]);
                let (so, sn) = ((m - m_new).exp(), (part.max[h] - m_new).exp());
                for (o, &x) in dst.iter_mut().zip(&part.acc[h * d..(h + 1) * d]) {
                    *o = o.mul_add(so, x * sn);
                }
                s = s.mul_add(so, part.sum[h] * sn);
                m = m_new;
            }
            if s != 0.0 {
                let inv = 1.0 / s;
                dst.iter_mut().for_each(|o| *o *= inv);
            }
        }
        return;
    }
    let p = ggml_partial(qg, rows, span, scale);
    write_normalized(out, &p.acc, &p.sum, d);
}

/// The unnormalized state of the online softmax over a span, per query head.
pub(super) struct Partial {
    pub(super) max: Vec<f32>,
    pub(super) sum: Vec<f32>,
    /// `[head][dim]`, f16-valued.
    pub(super) acc: Vec<f32>,
}

pub(super) fn ggml_partial(qg: &[f32], rows: &Rows, span: &Span, scale: f32) -> Partial {
    let n_q = qg.len() / rows.head_dim;
    let mut p = Partial {
        max: vec![f32::NEG_INFINITY; n_q],
        sum: vec![0f32; n_q],
        acc: vec![0f32; qg.len()],
    };
    #[cfg(target_arch = "x86_64")]
    if crate::vexp::has_avx512() && has_f16c() {
        // SAFETY: AVX-512 F, FMA and F16C are available.
        unsafe { attend_ggml_avx512(qg, rows, span, scale, &mut p) };
        return p;
    }
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: AVX2, FMA and F16C are available.
        unsafe { attend_ggml_avx2(qg, rows, span, scale, &mut p) };
        return p;
    }
    attend_ggml_body(qg, rows, span, scale, &mut p);
    p
}

/// The AVX-512 form of [`attend_ggml_body`]: the same operations per (position, head), done a
/// KV block (up to 16 positions) at a time: the block's 16-lane partial dots for every head,
/// then per head one exact 16-way horizontal reduction, the online-softmax decisions of the 16
/// positions, their `expf`s in one vector ([`crate::libm_exp`], libm's bits) and the f16
/// accumulator walked through the positions in registers. head_dim 64, 128 or 256 (others
/// take the portable body).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_ggml_avx512(qg: &[f32], rows: &Rows, span: &Span, scale: f32, out: &mut Partial) {
    let n_q = qg.len() / rows.head_dim;
    match rows.head_dim {
        _ if n_q > 16 => attend_ggml_body(qg, rows, span, scale, out),
        64 => attend_ggml_blocks::<4>(qg, rows, span, scale, out),
        128 => attend_ggml_blocks::<8>(qg, rows, span, scale, out),
        256 => attend_ggml_blocks::<16>(qg, rows, span, scale, out),
        _ => attend_ggml_body(qg, rows, span, scale, out),
    }
}

/// [`attend_ggml_avx512`] for head_dim `16 * NV`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
unsafe fn attend_ggml_blocks<const NV: usize>(
    qg: &[f32],
    rows: &Rows,
    span: &Span,
    scale: f32,
    out: &mut Partial,
) {
    use std::arch::x86_64::*;
    let d = 16 * NV;
    let n_q = qg.len() / d;
    let exact_exp = crate::libm_exp::matches_libm();
    let round = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut q16 = [[_mm512_setzero_ps(); NV]; 16];
    for h in 0..n_q {
        for j in 0..NV {
            q16[h][j] = round(_mm512_loadu_ps(qg.as_ptr().add(h * d + 16 * j)));
        }
    }
    // Per block: [head][position] partial dots (16 lanes each), the V rows as f32.
    let mut partial = [[_mm512_setzero_ps(); 16]; 16];
    let mut vrows = [[_mm512_setzero_ps(); NV]; 16];
    let mut exps = [[0f32; 16]; 16];
    let mut new_maxes = [0u32; 16];
    let (dist, hint) = kv_prefetch_tuning();
    // `ahead`: the first row and count of the chunk `dist` chunks on, to prefetch.
    let mut block = |row0: usize, n: usize, ahead_row: usize, ahead: usize| {
        let (k_run, v_run) = rows.run(row0, n);
        let (k_next, v_next) = rows.run(ahead_row, ahead);
        for p in 0..n {
            let kp = k_run.as_ptr().add(p * d) as *const __m256i;
            let vp = v_run.as_ptr().add(p * d) as *const __m256i;
            if p < ahead {
                let (kn, vn) = (k_next.as_ptr().add(p * d), v_next.as_ptr().add(p * d));
                for line in (0..d).step_by(32) {
                    if hint == 1 {
                        _mm_prefetch::<_MM_HINT_T1>(kn.add(line) as *const i8);
                        _mm_prefetch::<_MM_HINT_T1>(vn.add(line) as *const i8);
                    } else {
                        _mm_prefetch::<_MM_HINT_T0>(kn.add(line) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(vn.add(line) as *const i8);
                    }
                }
            }
            let mut k = [_mm512_setzero_ps(); NV];
            for j in 0..NV {
                k[j] = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(j)));
                vrows[p][j] = _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(j)));
            }
            for h in 0..n_q {
                // ggml_vec_dot_f16: 4 accumulators over 64-element steps.
                let mut a = [_mm512_setzero_ps(); 4];
                for j in 0..NV {
                    a[j % 4] = _mm512_fmadd_ps(k[j], q16[h][j], a[j % 4]);
                }
                partial[h][p] = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
            }
        }
        for h in 0..n_q {
            let dots = reduce_add_16_rows(&partial[h]);
            let s = _mm512_add_ps(
                _mm512_mul_ps(dots, _mm512_set1_ps(scale)),
                _mm512_setzero_ps(),
            );
            let mut score = [0f32; 16];
            _mm512_storeu_ps(score.as_mut_ptr(), s);
            // The online softmax's decisions: a new max rescales by exp(old - new) (vs = 1),
            // any other position weighs exp(s - max) (ms = 1).
            let mut arg = [0f32; 16];
            let mut new_max = 0u32;
            let mut m = out.max[h];
            for p in 0..n {
                if score[p] > m {
                    arg[p] = m - score[p];
                    new_max |= 1 << p;
                    m = score[p];
                } else {
                    arg[p] = score[p] - m;
                }
            }
            out.max[h] = m;
            let mut e = [0f32; 16];
            if exact_exp {
                _mm512_storeu_ps(
                    e.as_mut_ptr(),
                    crate::libm_exp::expf16(_mm512_loadu_ps(arg.as_ptr())),
                );
            } else {
                for p in 0..n {
                    e[p] = arg[p].exp();
                }
            }
            exps[h] = e;
            new_maxes[h] = new_max;
        }
        // The f16 accumulators, two heads at a time (twice the independent chains to hide
        // the FMA -> f16 -> f32 latency of each step).
        let mut h = 0;
        while h < n_q {
            let pair = (n_q - h).min(2);
            let acc_base = out.acc.as_mut_ptr();
            let acc_at = |i: usize| acc_base.add((h + i) * d);
            if pair == 2 {
                let (a, b) = (acc_at(0), acc_at(1));
                accumulate_v::<NV, 2>(
                    [a, b],
                    &mut out.sum[h..h + 2],
                    &exps[h..h + 2],
                    &new_maxes[h..h + 2],
                    &vrows,
                    n,
                );
            } else {
                accumulate_v::<NV, 1>(
                    [acc_at(0)],
                    &mut out.sum[h..h + 1],
                    &exps[h..h + 1],
                    &new_maxes[h..h + 1],
                    &vrows,
                    n,
                );
            }
            h += pair;
        }
    };
    span.for_each_chunk16(|pos, row0, n| {
        let at = pos + 16 * dist;
        match span.row_of(at) {
            Some(r) => block(row0, n, r, (span.n_pos - at).min(16)),
            None => block(row0, n, row0, 0),
        }
    });
}

/// Walks `H` heads' f16 accumulators (`acc[i]`: head_dim = 16 * NV floats) and sums through
/// `n` positions: a new max rescales (`acc = f16(acc * e)`, ms = e, vs = 1), then
/// `acc = f16(fma(v, vs, acc))` and `sum = fma(sum, ms, vs)`, llama.cpp's steps in its order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
unsafe fn accumulate_v<const NV: usize, const H: usize>(
    acc: [*mut f32; H],
    sum: &mut [f32],
    exps: &[[f32; 16]],
    new_max: &[u32],
    vrows: &[[std::arch::x86_64::__m512; NV]; 16],
    n: usize,
) {
    use std::arch::x86_64::*;
    let round = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut a = [[_mm512_setzero_ps(); NV]; H];
    for i in 0..H {
        for j in 0..NV {
            a[i][j] = _mm512_loadu_ps(acc[i].add(16 * j));
        }
    }
    for p in 0..n {
        for i in 0..H {
            let e = exps[i][p];
            let (ms, vs) = if new_max[i] & (1 << p) != 0 {
                let m = _mm512_set1_ps(e);
                for j in 0..NV {
                    a[i][j] = round(_mm512_mul_ps(a[i][j], m));
                }
                (e, 1.0)
            } else {
                (1.0, e)
            };
            let w = _mm512_set1_ps(vs);
            for j in 0..NV {
                a[i][j] = round(_mm512_fmadd_ps(vrows[p][j], w, a[i][j]));
            }
            sum[i] = sum[i].mul_add(ms, vs);
        }
    }
    for i in 0..H {
        for j in 0..NV {
            _mm512_storeu_ps(acc[i].add(16 * j), a[i][j]);
        }
    }
}

/// `_mm512_reduce_add_ps` of 16 vectors at once, in GCC's order for each (halves, quarters,
/// pairs, then the last two): lane `p` of the result is the reduction of `x[p]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce_add_16_rows(x: &[std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Halves: y[i] = [lanes 0..8 + lanes 8..16 of x[2i] | the same of x[2i+1]].
    let mut y = [_mm512_setzero_ps(); 8];
    for i in 0..8 {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        y[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        );
    }
    // Quarters: z[i] holds rows 4i..4i+4, one 128-bit block (4 lanes) each.
    let mut z = [_mm512_setzero_ps(); 4];
    for i in 0..4 {
        let (a, b) = (y[2 * i], y[2 * i + 1]);
        z[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        );
    }
    // Pairs: lanes 0 + 2 and 1 + 3 of each block; w[i] block c = rows (8i + c, 8i + 4 + c).
    let mut w = [_mm512_setzero_ps(); 2];
    for i in 0..2 {
        let (a, b) = (z[2 * i], z[2 * i + 1]);
        w[i] = _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        );
    }
    // The last two: lane 4c + k holds row 4k + c; put row p in lane p.
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, r)
}

/// The AVX2 form of [`attend_ggml_body`], bit for bit: per position, each head's score is the
/// same 4 x 16-lane FMA dot (each 16-lane accumulator as two 8-lane halves) reduced in GCC's
/// order, then the same online-softmax step with libm's `expf`, the f16 accumulator rescaled
/// and fused-multiply-added 8 lanes at a time. head_dim a multiple of 64 up to 256 (others take
/// the body).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register arrays indexed in lockstep
pub(super) unsafe fn attend_ggml_avx2(
    qg: &[f32],
    rows: &Rows,
    span: &Span,
    scale: f32,
    out: &mut Partial,
) {
    use std::arch::x86_64::*;
    let d = rows.head_dim;
    if !d.is_multiple_of(64) || d > 256 {
        attend_ggml_body(qg, rows, span, scale, out);
        return;
    }
    let n_q = qg.len() / d;
    let nv = d / 8;
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut q16 = vec![0f32; qg.len()];
    for (o, x) in q16.chunks_exact_mut(8).zip(qg.chunks_exact(8)) {
        _mm256_storeu_ps(o.as_mut_ptr(), round(_mm256_loadu_ps(x.as_ptr())));
    }
    let mut max = vec![f32::NEG_INFINITY; n_q];
    let mut sum = vec![0f32; n_q];
    let mut acc = vec![0f32; n_q * d];
    let mut k = [_mm256_setzero_ps(); 32];
    let mut v = [_mm256_setzero_ps(); 32];
    span.for_each_row(|row| {
        let kp = rows.k(row).as_ptr() as *const __m128i;
        let vp = rows.v(row).as_ptr() as *const __m128i;
        for j in 0..nv {
            k[j] = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(j)));
            v[j] = _mm256_cvtph_ps(_mm_loadu_si128(vp.add(j)));
        }
        for h in 0..n_q {
            let qh = q16.as_ptr().add(h * d);
            // Accumulator jj's lanes 8 hf .. 8 hf + 8 over each 64-element step.
            let mut a = [[_mm256_setzero_ps(); 2]; 4];
            for st in 0..d / 64 {
                for jj in 0..4 {
                    for hf in 0..2 {
                        let j = 8 * st + 2 * jj + hf;
                        let q = _mm256_loadu_ps(qh.add(8 * j));
                        a[jj][hf] = _mm256_fmadd_ps(k[j], q, a[jj][hf]);
                    }
                }
            }
            let half = |hf: usize| {
                _mm256_add_ps(
                    _mm256_add_ps(a[0][hf], a[2][hf]),
                    _mm256_add_ps(a[1][hf], a[3][hf]),
                )
            };
            let t3 = _mm256_add_ps(half(1), half(0));
            let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
            let t = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
            let dot = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
            let s = dot * scale + 0.0;
            let ap = acc.as_mut_ptr().add(h * d);
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > max[h] {
                ms = (max[h] - s).exp();
                max[h] = s;
                let m = _mm256_set1_ps(ms);
                for j in 0..nv {
                    let x = _mm256_loadu_ps(ap.add(8 * j));
                    _mm256_storeu_ps(ap.add(8 * j), round(_mm256_mul_ps(x, m)));
                }
            } else {
                vs = (s - max[h]).exp();
            }
            let w = _mm256_set1_ps(vs);
            for j in 0..nv {
                let x = _mm256_loadu_ps(ap.add(8 * j));
                _mm256_storeu_ps(ap.add(8 * j), round(_mm256_fmadd_ps(v[j], w, x)));
            }
            sum[h] = sum[h].mul_add(ms, vs);
        }
    });
    out.max = max;
    out.sum = sum;
    out.acc = acc;
}

/// `ggml_vec_dot_f16` as compiled for AVX-512 (F32 lanes): the result before rounding to f32.
#[inline(always)]
fn dot_f16_ggml(k: &[f32], q: &[f32]) -> f32 {
    let n = k.len();
    let np = n - n % 64;
    let mut acc = [[0f32; 16]; 4];
    for base in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let i = base + 16 * j + l;
                *a = k[i].mul_add(q[i], *a);
            }
        }
    }
    let mut x = [0f32; 16];
    for l in 0..16 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut t3 = [0f32; 8];
    for i in 0..8 {
        t3[i] = x[8 + i] + x[i];
    }
    let t6 = [t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]];
    let mut sum = ((t6[0] + t6[2]) + (t6[1] + t6[3])) as f64;
    for i in np..n {
        sum += (k[i] * q[i]) as f64;
    }
    sum as f32
}

#[inline(always)]
pub(super) fn attend_ggml_body(
    qg: &[f32],
    rows: &Rows,
    span: &Span,
    scale: f32,
    out: &mut Partial,
) {
    let d = rows.head_dim;
    let n_q = qg.len() / d;
    let q16: Vec<f32> = qg.iter().map(|x| round_f16(*x)).collect();
    // Per query head: running max, sum, and the f16-valued accumulator.
    let mut max = vec![f32::NEG_INFINITY; n_q];
    let mut sum = vec![0f32; n_q];
    let mut acc = vec![0f32; n_q * d];
    let mut k = vec![0f32; d];
    let mut v = vec![0f32; d];
    span.for_each_row(|row| {
        for (o, x) in k.iter_mut().zip(rows.k(row)) {
            *o = x.to_f32();
        }
        for (o, x) in v.iter_mut().zip(rows.v(row)) {
            *o = x.to_f32();
        }
        for h in 0..n_q {
            let s = dot_f16_ggml(&k, &q16[h * d..(h + 1) * d]) * scale + 0.0;
            let a = &mut acc[h * d..(h + 1) * d];
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > max[h] {
                ms = (max[h] - s).exp();
                max[h] = s;
                a.iter_mut().for_each(|x| *x = round_f16(*x * ms));
            } else {
                vs = (s - max[h]).exp();
            }
            for (x, &vv) in a.iter_mut().zip(&v) {
                *x = round_f16(vv.mul_add(vs, *x));
            }
            sum[h] = sum[h].mul_add(ms, vs);
        }
    });
    out.max = max;
    out.sum = sum;
    out.acc = acc;
}
