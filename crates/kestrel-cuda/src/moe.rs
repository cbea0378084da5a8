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
use crate::model::CudaModel;
use crate::ops::{cfg, MATVEC_MAX};
use crate::weights::DevMatrix;
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

    /// Rows of one expert's gate / up (the config's expert_ffn_dim).
    fn eff(&self) -> usize {
        self.gate.rows / self.n_experts.max(1)
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

    /// 8-bit blocks of `rows` rows of `n` floats at `src` into `q` / `qd` (`quantize_q`).
    fn quantize_rows(&mut self, src: u64, n: usize, rows: usize, q: u64, qd: u64) -> Result<()> {
        let f = self.gpu.func("quantize_q")?;
        let ni = n as i32;
        // SAFETY: src holds rows x n floats; q and qd are sized for them (MoeBufs).
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&src)
                .arg(&q)
                .arg(&qd)
                .arg(&ni)
                .launch(cfg((rows as u32, n.div_ceil(256) as u32, 1), 256))?;
        }
        Ok(())
    }
}

impl MoeOps for CudaModel {
    fn moe_route(&mut self, layer: usize, logits: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let (ne, k, norm) = (m.n_experts, m.n_used, m.norm_top_k);
        // the step's first routed layer starts the margins
        let first = (0..layer).all(|l| self.moe(l).is_err()) as i32;
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
        let (ids, wts) = (self.scratch.moe.ids.ptr, self.scratch.moe.wts.ptr);
        let margin = self.scratch.moe.margin.ptr;
        let (ne, k, norm) = (ne as i32, k as i32, norm as i32);
        let f = self.gpu.func("moe_route")?;
        // SAFETY: logits holds t x ne floats; ids / wts t x k entries (MoeBufs).
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&lp)
                .arg(&ne)
                .arg(&k)
                .arg(&norm)
                .arg(&ids)
                .arg(&wts)
                .arg(&margin)
                .arg(&first)
                .launch(cfg((t as u32, 1, 1), 32))?;
        }
        Ok(())
    }

    fn expert_swiglu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let (kind, eff, cols, ne, k) = (m.gate.kind, m.eff(), m.gate.cols, m.n_experts, m.n_used);
        let (gp, upp) = (m.gate.buf.ptr, m.up.buf.ptr);
        let (xp, xn) = self.buf(x);
        let (op, on) = self.buf(out);
        if xn != cols || on != eff {
            return Err(CudaError::Other(format!(
                "experts of [{eff}, {cols}] against rows of {xn} -> {on}"
            )));
        }
        let t = self.rows(x);
        if t == 0 {
            return Ok(());
        }
        let (q, qd) = if !kind.int8_activations() {
            (0, 0)
        } else if t <= MATVEC_MAX {
            // the norm's 8-bit copy, where it already is
            self.quantize(x)?;
            (self.scratch.xq.ptr, self.scratch.xd.ptr)
        } else {
            let (hq, hd) = (self.scratch.moe.hq.ptr, self.scratch.moe.hd.ptr);
            self.quantize_rows(xp, cols, t, hq, hd)?;
            (hq, hd)
        };
        let ids = self.scratch.moe.ids.ptr;
        let (e, c, n, ki) = (eff as i32, cols as i32, ne as i32, k as i32);
        let f = self.gpu.func(&format!("moe_gate_up_{}", kind.name()))?;
        // SAFETY: the stacks hold ne x eff rows of cols; x t rows, out t x k rows of eff.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&gp)
                .arg(&upp)
                .arg(&e)
                .arg(&c)
                .arg(&n)
                .arg(&ids)
                .arg(&ki)
                .arg(&q)
                .arg(&qd)
                .arg(&xp)
                .arg(&op)
                .launch(cfg((eff.div_ceil(4) as u32, (t * k) as u32, 1), 128))?;
        }
        self.wrote(out);
        Ok(())
    }

    fn expert_down_add(&mut self, layer: usize, ffn: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let m = self.moe(layer)?;
        let (kind, ne, k) = (m.down.kind, m.n_experts, m.n_used);
        let (eff, dim, dp) = (m.down.cols, m.down.rows / ne.max(1), m.down.buf.ptr);
        let (fp, fnn) = self.buf(ffn);
        let (xp, xn) = self.buf(out);
        if fnn != eff || xn != dim {
            return Err(CudaError::Other(format!(
                "experts' down of [{dim}, {eff}] against rows of {fnn} -> {xn}"
            )));
        }
        let t = self.rows(out);
        if t == 0 {
            return Ok(());
        }
        let (q, qd) = if kind.int8_activations() {
            let (fq, fd) = (self.scratch.moe.fq.ptr, self.scratch.moe.fd.ptr);
            self.quantize_rows(fp, eff, t * k, fq, fd)?;
            (fq, fd)
        } else {
            (0, 0)
        };
        let (ids, wts) = (self.scratch.moe.ids.ptr, self.scratch.moe.wts.ptr);
        let (d, e, n, ki) = (dim as i32, eff as i32, ne as i32, k as i32);
        let f = self.gpu.func(&format!("moe_down_{}", kind.name()))?;
        // SAFETY: the stack holds ne x dim rows of eff; ffn t x k rows of eff; out t x dim.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&dp)
                .arg(&d)
                .arg(&e)
                .arg(&n)
                .arg(&ids)
                .arg(&wts)
                .arg(&ki)
                .arg(&q)
                .arg(&qd)
                .arg(&fp)
                .arg(&xp)
                .launch(cfg((dim.div_ceil(4) as u32, t as u32, 1), 128))?;
        }
        self.wrote(out);
        Ok(())
    }
}
