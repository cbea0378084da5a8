//! The mixture-of-experts kernels (`kernels/moe.cu`) against the CPU: the router's top-k
//! (kestrel-models' `moe::route`), each route's SwiGLU expert and the weighted sum of the
//! routes' down projections (f64 dots over the dequantized stacks).

use super::{quantize_rows, random_matrix, rel_err, CaseResult, Rng};
use crate::device::Gpu;
use crate::error::Result;
use crate::moe::{launch_route, Acts, Experts, Groups};
use crate::weights::{to_device_layout, Kind};

/// Experts, routes a token, model width and expert width of the cases (a K-quant row's 256).
const N_EXP: usize = 8;
const K: usize = 3;
const DIM: usize = 512;
const EFF: usize = 256;

/// `x` as the int8 kernels see it: blocks of 32 rounded to `d * q` with `d = amax / 127`
/// (`quant32` in kernels/common.cuh); as it is for the f32 / f16 kernels.
fn as_read(kind: Kind, x: &[f32]) -> Vec<f32> {
    if !kind.int8_activations() {
        return x.to_vec();
    }
    x.chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            b.iter().map(move |&v| {
                if d == 0.0 {
                    0.0
                } else {
                    (v / d).round_ties_even() * d
                }
            })
        })
        .collect()
}

fn dot(w: &[f32], row: usize, x: &[f32]) -> f64 {
    let n = x.len();
    w[row * n..(row + 1) * n]
        .iter()
        .zip(x)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum()
}

pub fn check_moe(gpu: &mut Gpu, rng: &mut Rng, out: &mut Vec<CaseResult>) -> Result<()> {
    // 1 and 5 tokens: the mat-vecs a route; 12, 40 and 96: routes grouped by expert, tiles of
    // 8, 16 and 32 slots (the quantized types; F32 / F16 stay on the mat-vecs)
    for t in [1usize, 5, 12, 40, 96] {
        // routes: ids exact, weights within float rounding
        let logits = rng.vec(t * N_EXP, 3.0);
        let want = kestrel_models::moe::route(&logits, N_EXP, K, true);
        let dl = gpu.upload_f32(&logits)?;
        let (ids, wts, margin) = (
            gpu.alloc(t * K * 4)?,
            gpu.alloc(t * K * 4)?,
            gpu.alloc(t * 4)?,
        );
        let bufs = (ids.ptr, wts.ptr, margin.ptr);
        launch_route(gpu, dl.ptr, N_EXP, K, true, bufs, true, t)?;
        let mut got_ids = vec![0i32; t * K];
        gpu.read(ids.ptr, &mut got_ids)?;
        let got_w = gpu.read_f32(wts.ptr, t * K)?;
        let want_w: Vec<f32> = want.iter().map(|r| r.weight).collect();
        let same = got_ids
            .iter()
            .zip(&want)
            .all(|(&g, r)| g as usize == r.expert);
        out.push(CaseResult {
            op: format!("moe route {N_EXP} experts top {K} tokens {t} (ids equal, weights)"),
            err: if same {
                rel_err(&got_w, &want_w)
            } else {
                f64::INFINITY
            },
            tol: 1e-5,
        });
        // a NaN among the scores (a broken file) still routes to experts that exist
        let mut bad = logits.clone();
        bad[0] = f32::NAN;
        let db = gpu.upload_f32(&bad)?;
        launch_route(gpu, db.ptr, N_EXP, K, true, bufs, true, t)?;
        let mut nan_ids = vec![0i32; t * K];
        gpu.read(ids.ptr, &mut nan_ids)?;
        let in_range = nan_ids.iter().all(|&e| (0..N_EXP as i32).contains(&e));
        out.push(CaseResult {
            op: format!("moe route {N_EXP} experts top {K} tokens {t}, a NaN score: ids in range"),
            err: if in_range { 0.0 } else { f64::INFINITY },
            tol: 0.0,
        });
        launch_route(gpu, dl.ptr, N_EXP, K, true, bufs, true, t)?;
        let routes: Vec<(usize, f32)> = want.iter().map(|r| (r.expert, r.weight)).collect();
        for kind in Kind::QUANTIZED.into_iter().chain([Kind::F16, Kind::F32]) {
            check_experts(gpu, rng, out, kind, t, &routes, ids.ptr, wts.ptr)?;
        }
    }
    Ok(())
}

/// One type's expert stacks over `t` tokens routed by `routes` (already in `ids` / `wts` on
/// the device): gate/up + SwiGLU per route, then down, weighted and added to x.
#[allow(clippy::too_many_arguments)]
fn check_experts(
    gpu: &mut Gpu,
    rng: &mut Rng,
    out: &mut Vec<CaseResult>,
    kind: Kind,
    t: usize,
    routes: &[(usize, f32)],
    ids: u64,
    wts: u64,
) -> Result<()> {
    let (gf, gate) = random_matrix(kind, N_EXP * EFF, DIM, rng)?;
    let (uf, up) = random_matrix(kind, N_EXP * EFF, DIM, rng)?;
    let (df, down) = random_matrix(kind, N_EXP * DIM, EFF, rng)?;
    let [dg, du, dd] = [&gf, &uf, &df].map(|f| gpu.upload(&to_device_layout(kind, f)));
    let (dg, du, dd) = (dg?, du?, dd?);
    let int8 = kind.int8_activations();
    // the references read the activations as the kernels do: what is left is summation order
    let tol = 1e-4;

    // gate / up
    let x = rng.vec(t * DIM, 1.0);
    let dx = gpu.upload_f32(&x)?;
    let (xq, xd) = (gpu.alloc(t * DIM)?, gpu.alloc(t * DIM / 32 * 8)?);
    if int8 {
        quantize_rows(gpu, dx.ptr, xq.ptr, xd.ptr, t, DIM)?;
    }
    let ffn = gpu.alloc(t * K * EFF * 4)?;
    let e = Experts {
        kind,
        n_exp: N_EXP,
        eff: EFF,
        dim: DIM,
        k: K,
    };
    let acts = Acts {
        q: xq.ptr,
        d: xd.ptr,
        f: dx.ptr,
    };
    let tile = e.tile(t);
    let (_bufs, groups) = Groups::alloc(gpu, t * K, N_EXP, DIM, EFF)?;
    let path = match tile {
        Some(tw) => {
            let stacks = (dg.ptr, du.ptr);
            e.gate_up_grouped(gpu, stacks, ids, dx.ptr, &groups, ffn.ptr, (tw, t))?;
            format!(", grouped in tiles of {tw}")
        }
        None => {
            e.gate_up(gpu, (dg.ptr, du.ptr), ids, &acts, ffn.ptr, t)?;
            String::new()
        }
    };
    let got = gpu.read_f32(ffn.ptr, t * K * EFF)?;
    let mut want = vec![0f32; t * K * EFF];
    let xr = as_read(kind, &x);
    for (p, &(ex, _)) in routes.iter().enumerate() {
        let xt = &xr[(p / K) * DIM..(p / K + 1) * DIM];
        for r in 0..EFF {
            let (g, u) = (dot(&gate, ex * EFF + r, xt), dot(&up, ex * EFF + r, xt));
            want[p * EFF + r] = (g / (1.0 + (-g).exp()) * u) as f32;
        }
    }
    out.push(CaseResult {
        op: format!(
            "moe gate/up swiglu {} [{N_EXP}x{EFF}x{DIM}] tokens {t}{path}",
            kind.name()
        ),
        err: rel_err(&got, &want),
        tol,
    });

    // down, from the reference's SwiGLU rows, into a residual
    let dffn = gpu.upload_f32(&want)?;
    let (fq, fd) = (gpu.alloc(t * K * EFF)?, gpu.alloc(t * K * EFF / 32 * 8)?);
    if int8 {
        quantize_rows(gpu, dffn.ptr, fq.ptr, fd.ptr, t * K, EFF)?;
    }
    let base = rng.vec(t * DIM, 1.0);
    let dres = gpu.upload_f32(&base)?;
    let acts = Acts {
        q: fq.ptr,
        d: fd.ptr,
        f: dffn.ptr,
    };
    match tile {
        Some(tw) => e.down_grouped(gpu, dd.ptr, wts, dffn.ptr, &groups, dres.ptr, (tw, t))?,
        None => e.down(gpu, dd.ptr, (ids, wts), &acts, dres.ptr, t)?,
    }
    let got = gpu.read_f32(dres.ptr, t * DIM)?;
    let ffn_r = as_read(kind, &want);
    let mut want_x = vec![0f32; t * DIM];
    for tok in 0..t {
        for r in 0..DIM {
            let sum: f64 = (0..K)
                .map(|j| {
                    let p = tok * K + j;
                    let (ex, w) = routes[p];
                    w as f64 * dot(&down, ex * DIM + r, &ffn_r[p * EFF..(p + 1) * EFF])
                })
                .sum();
            want_x[tok * DIM + r] = (base[tok * DIM + r] as f64 + sum) as f32;
        }
    }
    // the residual's share is exact: compare what was added
    let added = |v: &[f32]| -> Vec<f32> { v.iter().zip(&base).map(|(a, b)| a - b).collect() };
    out.push(CaseResult {
        op: format!(
            "moe down weighted + residual {} [{N_EXP}x{DIM}x{EFF}] tokens {t}{path}",
            kind.name()
        ),
        err: rel_err(&added(&got), &added(&want_x)),
        tol,
    });
    Ok(())
}

/// A stack of `rows` random rows of `cols` (speed does not depend on the values) and the bytes
/// of one of its `n_exp` experts.
fn random_stack(
    gpu: &Gpu,
    kind: Kind,
    n_exp: usize,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> Result<(crate::device::DevBuf, usize)> {
    let rb = kestrel_quant::row_bytes(kind.ggml(), cols)
        .map_err(|e| crate::error::CudaError::Other(e.to_string()))?;
    let bytes: Vec<u8> = (0..rows * rb).map(|_| rng.next_u64() as u8).collect();
    Ok((gpu.upload(&bytes)?, rb * rows / n_exp))
}

/// `gpu-check --perf moe`: the expert kernels on Qwen3-30B-A3B's shapes (128 experts of 768 x
/// 2,048, 8 routes a token; gate/up Q4_K, down Q4_K and Q6_K as in its Q4_K_M file) for steps
/// of 1, 8, 64 and 512 tokens (the last two grouped by expert, and again a route at a time),
/// each replay of the captured launches with other random routes: (what, us a launch, GB/s of
/// the distinct experts' bytes, each counted once).
pub fn perf_moe(gpu: &mut Gpu, rng: &mut Rng) -> Result<Vec<(String, f64, f64)>> {
    // 30B-A3B's experts, routes a token, width and expert width; launches timed
    let (n_exp, eff, dim, k_used, reps) = (128usize, 768usize, 2048usize, 8usize, 10usize);
    let (gate, gate_bytes) = random_stack(gpu, Kind::Q4K, n_exp, n_exp * eff, dim, rng)?;
    let (up, _) = random_stack(gpu, Kind::Q4K, n_exp, n_exp * eff, dim, rng)?;
    let downs = [Kind::Q4K, Kind::Q6K].map(|kind| {
        random_stack(gpu, kind, n_exp, n_exp * dim, eff, rng).map(|(buf, bytes)| (kind, buf, bytes))
    });
    let [d4, d6] = downs;
    let downs = [d4?, d6?];
    let mut res = Vec::new();
    for t in [1usize, 8, 64, 512] {
        // reps sets of routes: each token's k_used distinct experts
        let mut sets = Vec::new();
        let mut distinct = 0usize;
        for _ in 0..reps {
            let mut ids = Vec::with_capacity(t * k_used);
            for _ in 0..t {
                let mut mine: Vec<i32> = Vec::new();
                while mine.len() < k_used {
                    let e = (rng.next_u64() % n_exp as u64) as i32;
                    if !mine.contains(&e) {
                        mine.push(e);
                    }
                }
                ids.extend(mine);
            }
            let mut u = ids.clone();
            u.sort_unstable();
            u.dedup();
            distinct += u.len();
            sets.push(gpu.upload(&super::bytes_i32(&ids))?);
        }
        let distinct = distinct as f64 / reps as f64;
        let routes = t * k_used;
        let wts = gpu.upload_f32(&vec![1.0 / k_used as f32; routes])?;
        let x = gpu.upload_f32(&rng.vec(t * dim, 1.0))?;
        let (xq, xd) = (gpu.alloc(t * dim)?, gpu.alloc(t * dim / 32 * 8)?);
        quantize_rows(gpu, x.ptr, xq.ptr, xd.ptr, t, dim)?;
        let ffn = gpu.upload_f32(&rng.vec(routes * eff, 1.0))?;
        let (fq, fd) = (gpu.alloc(routes * eff)?, gpu.alloc(routes * eff / 32 * 8)?);
        quantize_rows(gpu, ffn.ptr, fq.ptr, fd.ptr, routes, eff)?;
        let out = gpu.alloc(routes * eff * 4)?;
        let resid = gpu.alloc(t * dim * 4)?;
        let (_bufs, groups) = Groups::alloc(gpu, routes, n_exp, dim, eff)?;
        let gate_up = Experts {
            kind: Kind::Q4K,
            n_exp,
            eff,
            dim,
            k: k_used,
        };
        let xa = Acts {
            q: xq.ptr,
            d: xd.ptr,
            f: x.ptr,
        };
        let fa = Acts {
            q: fq.ptr,
            d: fd.ptr,
            f: ffn.ptr,
        };
        // the grouped kernels where a step takes them, and the mat-vecs a route (for longer
        // steps: what they replace)
        let ways: Vec<Option<usize>> = match gate_up.tile(t) {
            Some(tw) => vec![Some(tw), None],
            None => vec![None],
        };
        for way in ways {
            let how = match way {
                Some(tw) => format!("grouped, tiles of {tw}"),
                None => "a route at a time".to_string(),
            };
            let stacks = (gate.ptr, up.ptr);
            let us = super::time_us(gpu, 2, reps, true, |gpu, i| match way {
                Some(tw) => {
                    let ids = sets[i % reps].ptr;
                    gate_up.gate_up_grouped(gpu, stacks, ids, x.ptr, &groups, out.ptr, (tw, t))
                }
                None => gate_up.gate_up(gpu, stacks, sets[i % reps].ptr, &xa, out.ptr, t),
            })?;
            let bytes = 2.0 * distinct * gate_bytes as f64;
            res.push((
                format!("gate/up q4_k [{n_exp}x{eff}x{dim}], {t} token(s), {distinct:.1} experts, {how}"),
                us,
                bytes / us / 1e3,
            ));
            for (kind, down, down_bytes) in &downs {
                let e = Experts {
                    kind: *kind,
                    ..gate_up
                };
                // the grouped down reads the slots of the last grouped gate/up: any routes'
                // slots time the same
                let us = super::time_us(gpu, 2, reps, true, |gpu, i| match way {
                    Some(tw) => {
                        e.down_grouped(gpu, down.ptr, wts.ptr, ffn.ptr, &groups, resid.ptr, (tw, t))
                    }
                    None => e.down(
                        gpu,
                        down.ptr,
                        (sets[i % reps].ptr, wts.ptr),
                        &fa,
                        resid.ptr,
                        t,
                    ),
                })?;
                let bytes = distinct * *down_bytes as f64;
                res.push((
                    format!(
                        "down {} [{n_exp}x{dim}x{eff}], {t} token(s), {distinct:.1} experts, {how}",
                        kind.name()
                    ),
                    us,
                    bytes / us / 1e3,
                ));
            }
        }
    }
    Ok(res)
}
