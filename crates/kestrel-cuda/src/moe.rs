//! Mixture-of-experts FFNs (Qwen3-MoE) on the GPU: [`MoeOps`] over the model's buffers, run
//! by `kernels/moe.cu`. A layer's experts are stacked into one matrix per role (gate, up,
//! down); the router is a plain matmul; the routes (expert ids and weights) stay in device
//! memory, so a decode step with experts is one CUDA graph like a dense model's.
//!
//! Each route runs its expert as mat-vecs (a warp a row): a token reads only its `n_used`
//! experts, which is what decode wants. A prompt step reads an expert once per route that
//! picks it, not once for all its tokens (no grouping of routes by expert yet): correct at
//! every size, but prompt steps re-read the experts their tokens share.

use crate::device::{DevBuf, Gpu};
use crate::error::{CudaError, Result};
use crate::matmul::quantize_rows;
use crate::model::CudaModel;
use crate::ops::{cfg, MATVEC_MAX};
use crate::weights::{DevMatrix, Kind};
use cudarc::driver::PushKernelArg;
use kestrel_models::backend::{Buf, MoeOps};
use kestrel_models::config::MoeConfig;
use kestrel_models::moe::MoeWeights;
use kestrel_models::ModelConfig;

/// Experts a router may score (`kernels/moe.cu`'s `MOE_MAX_EXPERTS`: a warp a token, 16 a lane).
pub const MAX_EXPERTS: usize = 512;

/// Routes a token may take (`moe_route` keeps choice j in lane j).
pub const MAX_USED: usize = 32;

/// A layer's router and expert stacks on the device.
pub struct MoeDev {
    /// (n_experts, dim)
    pub router: DevMatrix,
    /// (n_experts * expert_ffn_dim, dim): expert e's rows from e * expert_ffn_dim
    pub gate: DevMatrix,
    pub up: DevMatrix,
    /// (n_experts * dim, expert_ffn_dim)
    pub down: DevMatrix,
    pub n_experts: usize,
    pub n_used: usize,
    pub norm_top_k: bool,
}

impl MoeDev {
    pub fn upload(gpu: &Gpu, m: &MoeWeights) -> Result<Self> {
        let gate = DevMatrix::upload_stack(gpu, &m.gate)?;
        let up = DevMatrix::upload_stack(gpu, &m.up)?;
        if gate.kind != up.kind {
            return Err(CudaError::Unsupported(format!(
                "experts whose gate ({:?}) and up ({:?}) differ in type",
                gate.kind, up.kind
            )));
        }
        Ok(Self {
            router: DevMatrix::upload(gpu, &m.router)?,
            gate,
            up,
            down: DevMatrix::upload_stack(gpu, &m.down)?,
            n_experts: m.gate.len(),
            n_used: m.n_used,
            norm_top_k: m.norm_top_k,
        })
    }

    /// The launches' shape, with `stack`'s type (the gate / up stacks', or the down stack's).
    fn shape(&self, stack: &DevMatrix) -> Experts {
        Experts {
            kind: stack.kind,
            n_exp: self.n_experts,
            eff: self.down.cols,
            dim: self.gate.cols,
            k: self.n_used,
        }
    }
}

/// Refuses the mixtures the kernels cannot run, before any weight is uploaded.
pub fn check_config(m: &MoeConfig, max_batch: usize) -> Result<()> {
    if m.n_experts > MAX_EXPERTS || m.n_used > MAX_USED {
        return Err(CudaError::Unsupported(format!(
            "{} experts with {} used a token (up to {MAX_EXPERTS} and {MAX_USED} on the GPU)",
            m.n_experts, m.n_used
        )));
    }
    // a launch's routes are its grid's y (at most 65,535)
    if max_batch * m.n_used > 65_535 {
        return Err(CudaError::Unsupported(format!(
            "steps of {max_batch} tokens with {} routes each",
            m.n_used
        )));
    }
    Ok(())
}

/// The step's buffers of a mixture: router logits, routes, each route's SwiGLU output, and the
/// 8-bit copies the expert kernels read (the tokens' normed rows past the mat-vecs' size, the
/// routes' SwiGLU rows). Sized for `max_batch` tokens; 16-byte placeholders for other models.
pub struct MoeBufs {
    pub router: DevBuf,
    pub ids: DevBuf,
    pub wts: DevBuf,
    /// Per token, the smallest router margin of the step (`moe_route`; [`CudaModel::route_margins`]).
    pub margin: DevBuf,
    pub ffn: DevBuf,
    pub hq: DevBuf,
    pub hd: DevBuf,
    pub fq: DevBuf,
    pub fd: DevBuf,
}

impl MoeBufs {
    /// Bytes of each buffer, in field order.
    fn sizes(cfg: &ModelConfig, t: usize) -> [usize; 9] {
        let Some(m) = &cfg.moe else {
            return [0; 9];
        };
        let routes = t * m.n_used;
        let ffn = routes * m.expert_ffn_dim;
        [
            4 * t * m.n_experts,
            4 * routes,
            4 * routes,
            4 * t,
            4 * ffn,
            t * cfg.dim,
            8 * t * cfg.dim.div_ceil(32),
            ffn,
            8 * ffn.div_ceil(32),
        ]
    }

    pub fn bytes_for(cfg: &ModelConfig, max_batch: usize) -> u64 {
        Self::sizes(cfg, max_batch).iter().sum::<usize>() as u64
    }

    pub fn new(gpu: &Gpu, cfg: &ModelConfig, max_batch: usize) -> Result<Self> {
        let [router, ids, wts, margin, ffn, hq, hd, fq, fd] = Self::sizes(cfg, max_batch);
        Ok(Self {
            router: gpu.alloc(router)?,
            ids: gpu.alloc(ids)?,
            wts: gpu.alloc(wts)?,
            margin: gpu.alloc(margin)?,
            ffn: gpu.alloc(ffn)?,
            hq: gpu.alloc(hq)?,
            hd: gpu.alloc(hd)?,
            fq: gpu.alloc(fq)?,
            fd: gpu.alloc(fd)?,
        })
    }
}

/// The shape of a layer's expert launches: the stacks' type, experts, rows of one expert's
/// gate / up (`eff`), the model's width (`dim`) and routes a token (`k`).
#[derive(Clone, Copy)]
pub(crate) struct Experts {
    pub kind: Kind,
    pub n_exp: usize,
    pub eff: usize,
    pub dim: usize,
    pub k: usize,
}

/// Activation rows as the expert kernels read them: int8 blocks (`q`, `d`: the quantized
/// types; 0 for F32 / F16) and the f32 rows (`f`).
pub(crate) struct Acts {
    pub q: u64,
    pub d: u64,
    pub f: u64,
}

/// The routes of `tokens` tokens from their router logits (`moe_route`) into `ids` / `wts`
/// (`tokens * k` each) and `margin` (one a token; `first`: this layer starts it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_route(
    gpu: &mut Gpu,
    logits: u64,
    n_exp: usize,
    k: usize,
    norm: bool,
    (ids, wts, margin): (u64, u64, u64),
    first: bool,
    tokens: usize,
) -> Result<()> {
    let f = gpu.func("moe_route")?;
    let (ne, k, norm, first) = (n_exp as i32, k as i32, norm as i32, first as i32);
    // SAFETY: logits holds tokens x n_exp floats; ids / wts tokens x k entries, margin tokens.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&logits)
            .arg(&ne)
            .arg(&k)
            .arg(&norm)
            .arg(&ids)
            .arg(&wts)
            .arg(&margin)
            .arg(&first)
            .launch(cfg((tokens as u32, 1, 1), 32))?;
    }
    Ok(())
}

impl Experts {
    /// `moe_gate_up_<kind>`: each of the `tokens * k` routes' SwiGLU rows into `out`.
    pub(crate) fn gate_up(
        &self,
        gpu: &mut Gpu,
        (gate, up): (u64, u64),
        ids: u64,
        x: &Acts,
        out: u64,
        tokens: usize,
    ) -> Result<()> {
        let f = gpu.func(&format!("moe_gate_up_{}", self.kind.name()))?;
        let (e, c, n, k) = (
            self.eff as i32,
            self.dim as i32,
            self.n_exp as i32,
            self.k as i32,
        );
        let grid = (self.eff.div_ceil(4) as u32, (tokens * self.k) as u32, 1);
        // SAFETY: the stacks hold n_exp x eff rows of dim; x tokens rows; out tokens x k rows
        // of eff; ids tokens x k experts below n_exp.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&gate)
                .arg(&up)
                .arg(&e)
                .arg(&c)
                .arg(&n)
                .arg(&ids)
                .arg(&k)
                .arg(&x.q)
                .arg(&x.d)
                .arg(&x.f)
                .arg(&out)
                .launch(cfg(grid, 128))?;
        }
        Ok(())
    }

    /// `moe_down_<kind>`: each token's routes' down projections of `ffn`, weighted by `wts`,
    /// added into its row of `x`.
    pub(crate) fn down(
        &self,
        gpu: &mut Gpu,
        down: u64,
        (ids, wts): (u64, u64),
        ffn: &Acts,
        x: u64,
        tokens: usize,
    ) -> Result<()> {
        let f = gpu.func(&format!("moe_down_{}", self.kind.name()))?;
        let (d, e, n, k) = (
            self.dim as i32,
            self.eff as i32,
            self.n_exp as i32,
            self.k as i32,
        );
        // SAFETY: the stack holds n_exp x dim rows of eff; ffn tokens x k rows of eff; x tokens
        // rows of dim.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(&down)
                .arg(&d)
                .arg(&e)
                .arg(&n)
                .arg(&ids)
                .arg(&wts)
                .arg(&k)
                .arg(&ffn.q)
                .arg(&ffn.d)
                .arg(&ffn.f)
                .arg(&x)
                .launch(cfg((self.dim.div_ceil(4) as u32, tokens as u32, 1), 128))?;
        }
        Ok(())
    }
}

impl CudaModel {
    /// Per token of the last pass: the smallest gap, in router logits, between the last expert
    /// a route took and the next one, over its layers (infinite when every expert is used;
    /// empty for models without experts). A check that finds the GPU and a reference apart
    /// from some position on reads here whether a routing near-tie explains it.
    pub fn route_margins(&mut self) -> Result<Vec<f32>> {
        if self.config.moe.is_none() {
            return Ok(Vec::new());
        }
        self.gpu.bind()?;
        self.gpu.stream.synchronize()?;
        let mut margins = vec![0f32; self.step.t];
        self.gpu.read(self.scratch.moe.margin.ptr, &mut margins)?;
        Ok(margins)
    }
}

impl MoeOps for CudaModel {
    fn moe_route(&mut self, layer: usize, logits: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let (ne, k, norm) = (m.n_experts, m.n_used, m.norm_top_k);
        // the step's first routed layer starts the margins
        let first = (0..layer).all(|l| self.moe(l).is_err());
        let (lp, n) = self.buf(logits);
        let t = self.rows(logits);
        if n != ne {
            return Err(CudaError::Other(format!(
                "router logits of {n} experts for a layer of {ne}"
            )));
        }
        if t == 0 {
            return Ok(());
        }
        let b = &self.scratch.moe;
        let out = (b.ids.ptr, b.wts.ptr, b.margin.ptr);
        launch_route(&mut self.gpu, lp, ne, k, norm, out, first, t)
    }

    fn expert_swiglu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let e = m.shape(&m.gate);
        let stacks = (m.gate.buf.ptr, m.up.buf.ptr);
        let (xp, xn) = self.buf(x);
        let (op, on) = self.buf(out);
        if xn != e.dim || on != e.eff || m.up.kind != e.kind {
            return Err(CudaError::Other(format!(
                "experts of [{}, {}] against rows of {xn} -> {on}",
                e.eff, e.dim
            )));
        }
        let t = self.rows(x);
        if t == 0 {
            return Ok(());
        }
        let (q, d) = if !e.kind.int8_activations() {
            (0, 0)
        } else if t <= MATVEC_MAX {
            // the norm's 8-bit copy, where it already is
            self.quantize(x)?;
            (self.scratch.xq.ptr, self.scratch.xd.ptr)
        } else {
            let (hq, hd) = (self.scratch.moe.hq.ptr, self.scratch.moe.hd.ptr);
            quantize_rows(&mut self.gpu, xp, hq, hd, t, e.dim)?;
            (hq, hd)
        };
        let ids = self.scratch.moe.ids.ptr;
        e.gate_up(&mut self.gpu, stacks, ids, &Acts { q, d, f: xp }, op, t)?;
        self.wrote(out);
        Ok(())
    }

    fn expert_down_add(&mut self, layer: usize, ffn: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let e = m.shape(&m.down);
        let dp = m.down.buf.ptr;
        let (fp, fnn) = self.buf(ffn);
        let (xp, xn) = self.buf(out);
        if fnn != e.eff || xn != e.dim {
            return Err(CudaError::Other(format!(
                "experts' down of [{}, {}] against rows of {fnn} -> {xn}",
                e.dim, e.eff
            )));
        }
        let t = self.rows(out);
        if t == 0 {
            return Ok(());
        }
        let (q, d) = if e.kind.int8_activations() {
            let (fq, fd) = (self.scratch.moe.fq.ptr, self.scratch.moe.fd.ptr);
            quantize_rows(&mut self.gpu, fp, fq, fd, t * e.k, e.eff)?;
            (fq, fd)
        } else {
            (0, 0)
        };
        let routes = (self.scratch.moe.ids.ptr, self.scratch.moe.wts.ptr);
        e.down(&mut self.gpu, dp, routes, &Acts { q, d, f: fp }, xp, t)?;
        self.wrote(out);
        Ok(())
    }
}
