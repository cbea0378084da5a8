//! The mixture-of-experts kernels (`kernels/moe.cu`) against the CPU: the router's top-k
//! (kestrel-models' `moe::route`), each route's SwiGLU expert and the weighted sum of the
//! routes' down projections (f64 dots over the dequantized stacks).

use super::{cfg, quantize_rows, random_matrix, rel_err, CaseResult, Rng};
use crate::device::Gpu;
use crate::error::Result;
use crate::weights::{to_device_layout, Kind};
use cudarc::driver::PushKernelArg;

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
            b.iter()
                .map(move |&v| if d == 0.0 { 0.0 } else { (v / d).round_ties_even() * d })
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
    for t in [1usize, 5] {
        // routes: ids exact, weights within float rounding
        let logits = rng.vec(t * N_EXP, 3.0);
        let want = kestrel_models::moe::route(&logits, N_EXP, K, true);
        let dl = gpu.upload_f32(&logits)?;
        let (ids, wts, margin) = (gpu.alloc(t * K * 4)?, gpu.alloc(t * K * 4)?, gpu.alloc(t * 4)?);
        let f = gpu.func("moe_route")?;
        let (ne, k, norm, first) = (N_EXP as i32, K as i32, 1i32, 1i32);
        // SAFETY: logits t x N_EXP floats; ids / wts t x K, margin t entries.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&dl.ptr)
                .arg(&ne)
                .arg(&k)
                .arg(&norm)
                .arg(&ids.ptr)
                .arg(&wts.ptr)
                .arg(&margin.ptr)
                .arg(&first)
                .launch(cfg((t as u32, 1, 1), 32))?;
        }
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
    let (ne, k) = (N_EXP as i32, K as i32);

    // gate / up
    let x = rng.vec(t * DIM, 1.0);
    let dx = gpu.upload_f32(&x)?;
    let (xq, xd) = (gpu.alloc(t * DIM)?, gpu.alloc(t * DIM / 32 * 8)?);
    if int8 {
        quantize_rows(gpu, dx.ptr, xq.ptr, xd.ptr, t, DIM)?;
    }
    let ffn = gpu.alloc(t * K * EFF * 4)?;
    let f = gpu.func(&format!("moe_gate_up_{}", kind.name()))?;
    let (e, c) = (EFF as i32, DIM as i32);
    // SAFETY: stacks N_EXP x EFF rows of DIM; x t rows; ffn t x K rows of EFF.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&dg.ptr)
            .arg(&du.ptr)
            .arg(&e)
            .arg(&c)
            .arg(&ne)
            .arg(&ids)
            .arg(&k)
            .arg(&xq.ptr)
            .arg(&xd.ptr)
            .arg(&dx.ptr)
            .arg(&ffn.ptr)
            .launch(cfg(((EFF / 4) as u32, (t * K) as u32, 1), 128))?;
    }
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
            "moe gate/up swiglu {} [{N_EXP}x{EFF}x{DIM}] tokens {t}",
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
    let f = gpu.func(&format!("moe_down_{}", kind.name()))?;
    let (d, e) = (DIM as i32, EFF as i32);
    // SAFETY: stack N_EXP x DIM rows of EFF; ffn t x K rows of EFF; residual t x DIM.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&dd.ptr)
            .arg(&d)
            .arg(&e)
            .arg(&ne)
            .arg(&ids)
            .arg(&wts)
            .arg(&k)
            .arg(&fq.ptr)
            .arg(&fd.ptr)
            .arg(&dffn.ptr)
            .arg(&dres.ptr)
            .launch(cfg(((DIM / 4) as u32, t as u32, 1), 128))?;
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
            "moe down weighted + residual {} [{N_EXP}x{DIM}x{EFF}] tokens {t}",
            kind.name()
        ),
        err: rel_err(&added(&got), &added(&want_x)),
        tol,
    });
    Ok(())
}
