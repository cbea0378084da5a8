//! The gated delta rule for one value head, in its two equal forms.
//!
//! With the state `S` (`[d_k, d_v]`), per token: decay `a = exp(g)`, then
//! `S = a S + k (beta (v - a Sᵀk))ᵀ` and `o = Sᵀ q` (`q`, `k` L2-normalized, `q` scaled by
//! `1/sqrt(d_k)` beforehand).
//!
//! - [`recurrent`]: that update token by token (decode).
//! - [`chunked`]: prefill in chunks of [`CHUNK`] tokens. Within a chunk, with `G_i` the
//!   cumulative log decay, the state after token `i` is `e^{G_i} S0 + Σ_{j≤i} e^{G_i-G_j} k_j
//!   u_jᵀ`, where the corrections `u` solve the unit lower-triangular system
//!   `(I + A) W = [beta v | beta e^{G} k]`, `A_ij = beta_i e^{G_i-G_j} k_i·k_j` (j < i) — the
//!   UT transform of the WY representation — and `u = W_v - W_k S0`. Outputs and the next
//!   state are then matrix products over the chunk, and the state is read and written once per
//!   chunk instead of once per token.
//!
//! Both forms compute in f64 over f32 inputs and an f32 state: in f32 the two orders of
//! summation drift apart by up to 1.8e-4 in the logits of the 300-token fixture prompt (this
//! small random model amplifies rounding), in f64 by 2e-5. The cost is small beside the
//! matmuls (one pass over the state per token or chunk). Every inner loop runs along a
//! contiguous row (`d_k` for dot products, `d_v` for the row updates), so the compiler
//! vectorizes them; the entry points are compiled three times (AVX-512, AVX2, baseline) and
//! picked at run time. The code has no fused multiply-adds and a fixed order of sums, so every
//! variant gives the same bits.
//!
//! Decode runs [`recurrent_step`]: one token over the f32 state in place, in blocks of 16
//! value columns (one cache line of each state row): `Sᵀk` of the decayed state, then the
//! update with `o = Sᵀq`, both over the block while it sits in L1, the sums in registers; no
//! copy of the state, and the same bits as [`recurrent`] on one token.

use super::gemm::{gemm_acc, Mat};

/// Tokens per chunk of the chunked form (as the reference implementations).
pub const CHUNK: usize = 64;

/// One value head's inputs over a run of tokens.
pub struct HeadSeq<'a> {
    /// `[T, d_k]`, L2-normalized and scaled by `1/sqrt(d_k)`.
    pub q: &'a [f64],
    /// `[T, d_k]`, L2-normalized.
    pub k: &'a [f64],
    /// `[T, d_v]`
    pub v: &'a [f64],
    /// `[T]`: log of the decay (<= 0).
    pub g: &'a [f64],
    /// `[T]`: the update strength, in (0, 1).
    pub beta: &'a [f64],
}

/// `y += a x`
#[inline]
fn axpy(y: &mut [f64], a: f64, x: &[f64]) {
    for (d, s) in y.iter_mut().zip(x) {
        *d += a * s;
    }
}

/// Token by token: the decode form. `state`: `[d_k, d_v]`, updated; `out`: `[T, d_v]`.
pub fn recurrent(h: &HeadSeq, dk: usize, dv: usize, state32: &mut [f32], out: &mut [f64]) {
    let mut state: Vec<f64> = state32.iter().map(|&v| v as f64).collect();
    let mut delta = vec![0f64; dv];
    for t in 0..h.g.len() {
        let (q, k) = (&h.q[t * dk..(t + 1) * dk], &h.k[t * dk..(t + 1) * dk]);
        let decay = h.g[t].exp();
        for s in state.iter_mut() {
            *s *= decay;
        }
        // delta = beta (v - Sᵀk)
        delta.copy_from_slice(&h.v[t * dv..(t + 1) * dv]);
        for (r, &kr) in k.iter().enumerate() {
            axpy(&mut delta, -kr, &state[r * dv..(r + 1) * dv]);
        }
        for d in delta.iter_mut() {
            *d *= h.beta[t];
        }
        // S += k deltaᵀ, o = Sᵀq
        let o = &mut out[t * dv..(t + 1) * dv];
        o.fill(0.0);
        for r in 0..dk {
            let row = &mut state[r * dv..(r + 1) * dv];
            axpy(row, k[r], &delta);
            axpy(o, q[r], row);
        }
    }
    for (d, s) in state32.iter_mut().zip(&state) {
        *d = *s as f32;
    }
}

multiversion! {
    /// One token of [`recurrent`] over the f32 state in place (decode): the same bits, without
    /// a copy of the state. `out`: `[d_v]`.
    pub fn recurrent_step => recurrent_step_impl(
        h: &HeadSeq,
        dk: usize,
        dv: usize,
        state: &mut [f32],
        out: &mut [f64],
    )
}

/// Value columns per block of [`recurrent_step`]: one cache line of the f32 state per row.
const STEP_COLS: usize = 16;

#[inline(always)]
fn recurrent_step_impl(h: &HeadSeq, dk: usize, dv: usize, state: &mut [f32], out: &mut [f64]) {
    let full = dv - dv % STEP_COLS;
    for j0 in (0..full).step_by(STEP_COLS) {
        step_cols::<STEP_COLS>(h, dk, dv, j0, state, out);
    }
    for j0 in full..dv {
        step_cols::<1>(h, dk, dv, j0, state, out);
    }
}

/// Columns `j0 .. j0 + W` of one token's update, both passes over those columns' `d_k x W`
/// slice of the state while it is in L1, the column sums in registers: every column's
/// operations in [`recurrent`]'s order, so the same bits.
#[inline(always)]
fn step_cols<const W: usize>(
    h: &HeadSeq,
    dk: usize,
    dv: usize,
    j0: usize,
    state: &mut [f32],
    out: &mut [f64],
) {
    let (q, k) = (&h.q[..dk], &h.k[..dk]);
    let decay = h.g[0].exp();
    // delta = beta (v - (decay S)ᵀk)
    let mut delta = [0f64; W];
    delta.copy_from_slice(&h.v[j0..j0 + W]);
    for (r, &kr) in k.iter().enumerate() {
        let row: &[f32; W] = state[r * dv + j0..][..W].try_into().expect("W columns");
        for (d, &s) in delta.iter_mut().zip(row) {
            *d += -kr * (s as f64 * decay);
        }
    }
    for d in delta.iter_mut() {
        *d *= h.beta[0];
    }
    // S = decay S + k deltaᵀ, o = Sᵀq
    let mut o = [0f64; W];
    for r in 0..dk {
        let row: &mut [f32; W] = (&mut state[r * dv + j0..][..W])
            .try_into()
            .expect("W columns");
        let (kr, qr) = (k[r], q[r]);
        for ((s, &d), o) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
            let n = *s as f64 * decay + kr * d;
            *o += qr * n;
            *s = n as f32;
        }
    }
    out[j0..j0 + W].copy_from_slice(&o);
}

/// Scratch of the chunked form, reused across calls: the state in f64, cumulative log decays,
/// the solved system `W = [W_v | W_k]` and the corrections `u`.
#[derive(Default)]
pub struct Scratch {
    state: Vec<f64>,
    gc: Vec<f64>,
    w: Vec<f64>,
    u: Vec<f64>,
    /// `[CHUNK, CHUNK]`: the solve's coefficients `A_ij`, then the outputs' `P_ij`.
    a: Vec<f64>,
    p: Vec<f64>,
    /// `[d_k, CHUNK]`: the decayed keys, transposed, for the state update.
    kt: Vec<f64>,
}

impl Scratch {
    fn fit(&mut self, dk: usize, dv: usize) {
        let fit = |v: &mut Vec<f64>, n: usize| {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        };
        fit(&mut self.state, dk * dv);
        fit(&mut self.gc, CHUNK);
        fit(&mut self.w, CHUNK * (dv + dk));
        fit(&mut self.u, CHUNK * dv);
        fit(&mut self.a, CHUNK * CHUNK);
        fit(&mut self.p, CHUNK * CHUNK);
        fit(&mut self.kt, dk * CHUNK);
    }
}

/// In chunks of [`CHUNK`]: the prefill form. Same contract as [`recurrent`].
pub fn chunked(h: &HeadSeq, dk: usize, dv: usize, state32: &mut [f32], out: &mut [f64]) {
    chunked_with(h, dk, dv, state32, out, &mut Scratch::default())
}

/// [`chunked`] with caller-kept scratch (no allocation once it has grown).
pub fn chunked_with(
    h: &HeadSeq,
    dk: usize,
    dv: usize,
    state32: &mut [f32],
    out: &mut [f64],
    s: &mut Scratch,
) {
    s.fit(dk, dv);
    chunked_mv(h, dk, dv, state32, out, s)
}

multiversion! {
    fn chunked_mv => chunked_impl(
        h: &HeadSeq,
        dk: usize,
        dv: usize,
        state32: &mut [f32],
        out: &mut [f64],
        s: &mut Scratch,
    )
}

#[inline(always)]
fn chunked_impl(
    h: &HeadSeq,
    dk: usize,
    dv: usize,
    state32: &mut [f32],
    out: &mut [f64],
    s: &mut Scratch,
) {
    let mut state = std::mem::take(&mut s.state);
    for (d, &v) in state.iter_mut().zip(state32.iter()) {
        *d = v as f64;
    }
    let t_len = h.g.len();
    for c0 in (0..t_len).step_by(CHUNK) {
        let n = (t_len - c0).min(CHUNK);
        let part = HeadSeq {
            q: &h.q[c0 * dk..(c0 + n) * dk],
            k: &h.k[c0 * dk..(c0 + n) * dk],
            v: &h.v[c0 * dv..(c0 + n) * dv],
            g: &h.g[c0..c0 + n],
            beta: &h.beta[c0..c0 + n],
        };
        chunk(
            &part,
            dk,
            dv,
            &mut state[..dk * dv],
            &mut out[c0 * dv..(c0 + n) * dv],
            s,
        );
    }
    for (d, s) in state32.iter_mut().zip(&state) {
        *d = *s as f32;
    }
    s.state = state;
}

/// One chunk of `n <= CHUNK` tokens: a triangular solve and four matrix products
/// ([`gemm_acc`], blocked in registers).
#[inline(always)]
fn chunk(h: &HeadSeq, dk: usize, dv: usize, state: &mut [f64], out: &mut [f64], s: &mut Scratch) {
    let n = h.g.len();
    let (q, k) = (h.q, h.k);
    let row_k = |i: usize| &k[i * dk..(i + 1) * dk];
    let Scratch {
        gc, w, u, a, p, kt, ..
    } = s;
    let mut acc = 0f64;
    for (c, &g) in gc.iter_mut().zip(h.g) {
        acc += g;
        *c = acc;
    }
    let gc = &gc[..n];

    // K Kᵀ and Q Kᵀ as matrix products over the transposed keys
    for (j, kj) in k.chunks_exact(dk).enumerate() {
        for (r, &x) in kj.iter().enumerate() {
            kt[r * CHUNK + j] = x;
        }
    }
    let ktm = Mat {
        data: kt,
        ld: CHUNK,
    };
    a[..n * CHUNK].fill(0.0);
    p[..n * CHUNK].fill(0.0);
    gemm_acc(n, n, dk, 1.0, Mat { data: k, ld: dk }, ktm, a, CHUNK);
    gemm_acc(n, n, dk, 1.0, Mat { data: q, ld: dk }, ktm, p, CHUNK);

    // W = (I + A)⁻¹ [beta v | beta e^G k], by forward substitution, row by row:
    // w_i = b_i - Σ_{j<i} A_ij w_j
    let wl = dv + dk;
    for i in 0..n {
        let (done, rest) = w.split_at_mut(i * wl);
        let wi = &mut rest[..wl];
        let b = h.beta[i];
        let bg = b * gc[i].exp();
        for (d, &x) in wi[..dv].iter_mut().zip(&h.v[i * dv..(i + 1) * dv]) {
            *d = b * x;
        }
        for (d, &x) in wi[dv..].iter_mut().zip(row_k(i)) {
            *d = bg * x;
        }
        let ai = &mut a[i * CHUNK..i * CHUNK + i];
        for (j, aij) in ai.iter_mut().enumerate() {
            *aij *= b * (gc[i] - gc[j]).exp();
        }
        let am = Mat {
            data: &a[i * CHUNK..],
            ld: CHUNK,
        };
        gemm_acc(1, wl, i, -1.0, am, Mat { data: done, ld: wl }, wi, wl);
    }

    // u = W_v - W_k S0
    let u = &mut u[..n * dv];
    for (ui, wi) in u.chunks_exact_mut(dv).zip(w.chunks_exact(wl)) {
        ui.copy_from_slice(&wi[..dv]);
    }
    let wk = Mat {
        data: &w[dv..],
        ld: wl,
    };
    gemm_acc(
        n,
        dv,
        dk,
        -1.0,
        wk,
        Mat {
            data: state,
            ld: dv,
        },
        u,
        dv,
    );

    // o_i = e^{G_i} S0ᵀ q_i + Σ_{j≤i} e^{G_i-G_j} (q_i·k_j) u_j
    out.fill(0.0);
    gemm_acc(
        n,
        dv,
        dk,
        1.0,
        Mat { data: q, ld: dk },
        Mat {
            data: state,
            ld: dv,
        },
        out,
        dv,
    );
    for (i, oi) in out.chunks_exact_mut(dv).enumerate() {
        let e = gc[i].exp();
        for o in oi.iter_mut() {
            *o *= e;
        }
        let pi = &mut p[i * CHUNK..i * CHUNK + n];
        for (j, pij) in pi.iter_mut().enumerate() {
            *pij = if j <= i {
                (gc[i] - gc[j]).exp() * *pij
            } else {
                0.0
            };
        }
    }
    gemm_acc(
        n,
        dv,
        n,
        1.0,
        Mat { data: p, ld: CHUNK },
        Mat { data: u, ld: dv },
        out,
        dv,
    );

    // S = e^{G_n} S0 + Σ_j e^{G_n-G_j} k_j u_jᵀ = e^{G_n} S0 + Kdᵀ U
    let last = gc[n - 1];
    let e = last.exp();
    for x in state.iter_mut() {
        *x *= e;
    }
    for (j, &gj) in gc.iter().enumerate() {
        let d = (last - gj).exp();
        for (r, &kr) in row_k(j).iter().enumerate() {
            kt[r * CHUNK + j] = d * kr;
        }
    }
    gemm_acc(
        dk,
        dv,
        n,
        1.0,
        Mat {
            data: kt,
            ld: CHUNK,
        },
        Mat { data: u, ld: dv },
        state,
        dv,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift) for test inputs in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f64 / (1u64 << 23) as f64 - 1.0
            })
            .collect()
    }

    fn l2_rows(x: &mut [f64], d: usize, scale: f64) {
        for row in x.chunks_exact_mut(d) {
            let n = row.iter().map(|v| v * v).sum::<f64>().sqrt();
            for v in row.iter_mut() {
                *v *= scale / n;
            }
        }
    }

    #[test]
    fn recurrent_step_equals_recurrent_bit_for_bit() {
        // dv: the remainder columns alone, full blocks and a remainder, Qwen3.5's 128
        for dv in [12, 40, 128] {
            step_equals_recurrent(16, dv);
        }
    }

    fn step_equals_recurrent(dk: usize, dv: usize) {
        let t_len = 5;
        let mut q = noise(11, t_len * dk);
        let mut k = noise(12, t_len * dk);
        l2_rows(&mut q, dk, 1.0 / (dk as f64).sqrt());
        l2_rows(&mut k, dk, 1.0);
        let v = noise(13, t_len * dv);
        let g: Vec<f64> = noise(14, t_len).iter().map(|x| -0.3 * (x + 1.0)).collect();
        let beta: Vec<f64> = noise(15, t_len).iter().map(|x| 0.5 + 0.45 * x).collect();
        let s0: Vec<f32> = noise(16, dk * dv).iter().map(|&v| v as f32).collect();
        let (mut a, mut b) = (s0.clone(), s0);
        for t in 0..t_len {
            let h = HeadSeq {
                q: &q[t * dk..(t + 1) * dk],
                k: &k[t * dk..(t + 1) * dk],
                v: &v[t * dv..(t + 1) * dv],
                g: &g[t..t + 1],
                beta: &beta[t..t + 1],
            };
            let (mut oa, mut ob) = (vec![0f64; dv], vec![0f64; dv]);
            recurrent(&h, dk, dv, &mut a, &mut oa);
            recurrent_step(&h, dk, dv, &mut b, &mut ob);
            assert_eq!(oa, ob, "dv {dv} token {t}");
            assert_eq!(a, b, "dv {dv} token {t}");
        }
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries() {
        let (t_len, dk, dv) = (150, 16, 12);
        let mut q = noise(1, t_len * dk);
        let mut k = noise(2, t_len * dk);
        l2_rows(&mut q, dk, 1.0 / (dk as f64).sqrt());
        l2_rows(&mut k, dk, 1.0);
        let v = noise(3, t_len * dv);
        let g: Vec<f64> = noise(4, t_len).iter().map(|x| -0.3 * (x + 1.0)).collect();
        let beta: Vec<f64> = noise(5, t_len).iter().map(|x| 0.5 + 0.45 * x).collect();
        let h = HeadSeq {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let s0: Vec<f32> = noise(6, dk * dv).iter().map(|&v| v as f32).collect();
        let (mut s_rec, mut s_chk) = (s0.clone(), s0);
        let mut o_rec = vec![0f64; t_len * dv];
        let mut o_chk = vec![0f64; t_len * dv];
        recurrent(&h, dk, dv, &mut s_rec, &mut o_rec);
        chunked(&h, dk, dv, &mut s_chk, &mut o_chk);
        let err = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f64, f64::max)
        };
        let s_err = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        assert!(
            err(&o_rec, &o_chk) < 1e-9,
            "outputs differ by {}",
            err(&o_rec, &o_chk)
        );
        assert!(
            s_err(&s_rec, &s_chk) < 1e-6,
            "states differ by {}",
            s_err(&s_rec, &s_chk)
        );
    }
}
