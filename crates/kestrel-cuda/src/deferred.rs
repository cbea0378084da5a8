//! What waits to be launched, and the folds that make it one kernel: an RMSNorm (one token),
//! the products that share an input (`matmul.rs`'s `flush_mm`) and the q/k/v epilogue (bias,
//! per-head norms, RoPE, the cache write), recorded as the recipe calls them and run when
//! something else needs their results.
//!
//! - The epilogue alone: `qkv_epilogue`, one block per (token, head), after the products.
//! - One token of a family without per-head norms (llama, qwen2): the products and the
//!   epilogue in the same warps (`mvx_1_rope`), and the norm before them in the same kernel too
//!   (`mvx_1_norm_rope`): three kernels and two links become one.

use crate::error::Result;
use crate::model::CudaModel;
use crate::ops::{cfg, switch_on};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use kestrel_models::backend::Buf;

/// The q/k/v epilogue ops recorded since the last other op (run as one kernel).
#[derive(Default, Clone, Copy)]
pub struct Pending {
    pub bias: [u64; 3],
    pub qn: u64,
    pub kn: u64,
    pub rope: bool,
    pub kv_layer: Option<usize>,
    /// Highest stage recorded: bias 1, norm 2, rope 3, kv write 4 (0: nothing pending).
    pub stage: u8,
}

/// A deferred RMSNorm of one row: `out = x / rms(x) * w` (weights at `w`).
#[derive(Clone, Copy, Debug)]
pub struct PendingNorm {
    pub x: Buf,
    pub w: u64,
    pub out: Buf,
}

impl CudaModel {
    /// Runs what was deferred: the mat-vecs sharing an input, then the q/k/v epilogue (both in
    /// one kernel where [`CudaModel::fold_qkv_epilogue`] can).
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.fold_qkv_epilogue()? {
            return Ok(());
        }
        self.flush_norm()?;
        self.flush_mm()?;
        self.flush_epilogue()
    }

    /// Whether this model's attention epilogue can run in the q/k/v products' warps: a dense
    /// family without per-head norms, RoPE over whole heads (`KESTREL_CUDA_QKV_FOLD=0`: never).
    fn qkv_foldable(&self) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let c = &self.config;
        matches!(self.recipe, crate::model::Recipe::Dense(f) if !f.qk_norm)
            && c.rope_dim == c.head_dim
            && c.head_dim.is_multiple_of(2)
            && switch_on(&ON, "KESTREL_CUDA_QKV_FOLD")
    }

    /// Whether a one-token step's RMSNorm may wait for the q/k/v products that read it, to run
    /// inside their kernel ([`CudaModel::fold_qkv_epilogue`]; `KESTREL_CUDA_NORM_FOLD=0`:
    /// never, the epilogue alone folded).
    pub(crate) fn norm_foldable(&self) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        self.qkv_foldable() && switch_on(&ON, "KESTREL_CUDA_NORM_FOLD")
    }

    /// Runs the deferred RMSNorm, if any: the f32 row and its 8-bit copy (`rms_norm_q`).
    pub(crate) fn flush_norm(&mut self) -> Result<()> {
        let Some(PendingNorm { x, w: wp, out }) = self.step.norm.take() else {
            return Ok(());
        };
        let (xp, n) = self.buf(x);
        let (op, _) = self.buf(out);
        let rows = self.rows(x);
        let (q, qd) = self.quantized_output(out);
        let (ni, eps) = (n as i32, self.config.rms_eps);
        let f = self.gpu.func("rms_norm_q")?;
        // SAFETY: arguments match the kernel's signature; buffers are sized for this step.
        unsafe {
            // in place, one block per row must read the row before anyone writes it
            let parts = if x == out { 1 } else { n.div_ceil(256) as u32 };
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&xp)
                .arg(&wp)
                .arg(&op)
                .arg(&q)
                .arg(&qd)
                .arg(&ni)
                .arg(&eps)
                .launch(cfg((rows as u32, parts, 1), 256))?;
        }
        self.wrote(out);
        if q != 0 {
            self.step.q8_of = Some(out);
        }
        Ok(())
    }

    /// Whether the deferred products write only Q, K and V: they may wait for the epilogue
    /// recorded after them (which reads them), so that both can become one kernel.
    fn qkv_deferred(&self) -> bool {
        !self.step.mm.is_empty()
            && self
                .step
                .mm
                .iter()
                .all(|&(_, out)| matches!(out, Buf::Q | Buf::K | Buf::V))
    }

    /// One token's q, k and v products with their epilogue in the same warps (`mvx_1_rope`,
    /// kernels/qkv.cu), where the deferred products are exactly q, k and v over one input of
    /// 8-bit activation types and the epilogue is a bias, RoPE over whole heads and the cache
    /// write, with no per-head norm (llama, qwen2): the epilogue kernel and its link go. A
    /// deferred norm of the products' input runs in the same kernel (`mvx_1_norm_rope`), else
    /// first. `KESTREL_CUDA_QKV_FOLD=0` keeps the kernels apart (A/B figures). Returns whether
    /// it ran.
    fn fold_qkv_epilogue(&mut self) -> Result<bool> {
        let p = self.step.pending;
        let c = &self.config;
        let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
        let Some(layer) = p.kv_layer else {
            return Ok(false);
        };
        if self.step.t != 1 || !p.rope || p.qn != 0 || p.kn != 0 || !self.qkv_foldable() {
            return Ok(false);
        }
        let (Some(x), [(wq, Buf::Q), (wk, Buf::K), (wv, Buf::V)]) =
            (self.step.mm_x, self.step.mm.as_slice())
        else {
            return Ok(false);
        };
        let (wq, wk, wv) = (*wq, *wk, *wv);
        let cols = self.buf(x).1;
        let mut mats = [(0u64, 0i32); 3];
        let mut all = "";
        for (i, (w, rows)) in [(wq, nh * hd), (wk, nkv * hd), (wv, nkv * hd)]
            .into_iter()
            .enumerate()
        {
            let m = self.matrix(w)?;
            if !m.kind.int8_activations() || m.rows != rows || m.cols != cols {
                return Ok(false);
            }
            if m.kind.fused_all_only() {
                all = "_all";
            }
            mats[i] = (m.buf.ptr, m.kind as i32);
        }
        self.step.mm.clear();
        self.step.mm_x = None;
        self.step.pending = Pending::default();
        // the norm that made the products' input, if it waits: in the same kernel
        let norm = match self.step.norm.take() {
            Some(n) if n.out == x => Some(n),
            other => {
                self.step.norm = other;
                self.flush_norm()?;
                self.quantize(x)?;
                None
            }
        };
        let (kc, vc) = self.kv_cache(layer);
        let (n_heads, n_kv, hdi, ci) = (nh as i32, nkv as i32, hd as i32, cols as i32);
        let (theta_scale, neox) = self.rotation();
        let eps = self.config.rms_eps;
        let s = &self.scratch;
        let (xq, xd, q) = (s.xq.ptr, s.xd.ptr, s.q.ptr);
        let (pos, kv_row) = (s.pos.ptr, s.kv_row.ptr);
        let warps = (nh + 2 * nkv) * hd / 2;
        let name = if norm.is_some() {
            format!("mvx_1_norm_rope{all}")
        } else {
            format!("mvx_1_rope{all}")
        };
        let f = self.gpu.func(&name)?;
        let mut b = self.gpu.stream.launch_builder(&f);
        b.arg(&mats[0].0)
            .arg(&mats[0].1)
            .arg(&mats[1].0)
            .arg(&mats[1].1)
            .arg(&mats[2].0)
            .arg(&mats[2].1)
            .arg(&n_heads)
            .arg(&n_kv)
            .arg(&hdi)
            .arg(&ci)
            .arg(&p.bias[0])
            .arg(&p.bias[1])
            .arg(&p.bias[2])
            .arg(&pos)
            .arg(&theta_scale)
            .arg(&neox)
            .arg(&q)
            .arg(&kc)
            .arg(&vc)
            .arg(&kv_row);
        let xp = norm.map_or(0, |n| self.buf(n.x).0);
        let launch = match &norm {
            Some(n) => {
                b.arg(&xp).arg(&n.w).arg(&eps);
                // a block of 8 warps normalizes the row into its shared memory (int8 + scales)
                LaunchConfig {
                    shared_mem_bytes: (cols + cols / 4) as u32,
                    ..cfg((warps.div_ceil(8) as u32, 1, 1), 256)
                }
            }
            None => {
                b.arg(&xq).arg(&xd);
                cfg((warps.div_ceil(4) as u32, 1, 1), 128)
            }
        };
        // SAFETY: arguments match the kernel's signature; buffers are sized for this step.
        unsafe { b.launch(launch) }?;
        if let Some(n) = norm {
            // its f32 rows and 8-bit copy were never written
            self.wrote(n.out);
        }
        for b in [Buf::Q, Buf::K, Buf::V] {
            self.wrote(b);
        }
        Ok(true)
    }

    /// Runs the recorded q/k/v epilogue, if any.
    fn flush_epilogue(&mut self) -> Result<()> {
        let p = self.step.pending;
        if p.stage == 0 {
            return Ok(());
        }
        self.step.pending = Pending::default();
        let c = &self.config;
        let (n_heads, n_kv, hd) = (c.n_heads as i32, c.n_kv_heads as i32, c.head_dim as i32);
        let rope_dim = if p.rope { c.rope_dim as i32 } else { 0 };
        let eps = c.rms_eps;
        let heads = (c.n_heads + 2 * c.n_kv_heads) as u32;
        let block = (c.head_dim.div_ceil(32) * 32) as u32;
        let (theta_scale, neox) = self.rotation();
        let (kc, vc) = p.kv_layer.map_or((0, 0), |l| self.kv_cache(l));
        let (q, k, v) = (self.scratch.q.ptr, self.scratch.k.ptr, self.scratch.v.ptr);
        let (pos, kv_row) = (self.scratch.pos.ptr, self.scratch.kv_row.ptr);
        let f = self.gpu.func("qkv_epilogue")?;
        let s = &self.gpu.stream;
        // SAFETY: arguments match the kernel's signature; buffers are sized for this step.
        unsafe {
            s.launch_builder(&f)
                .arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&n_heads)
                .arg(&n_kv)
                .arg(&hd)
                .arg(&p.bias[0])
                .arg(&p.bias[1])
                .arg(&p.bias[2])
                .arg(&p.qn)
                .arg(&p.kn)
                .arg(&eps)
                .arg(&pos)
                .arg(&rope_dim)
                .arg(&theta_scale)
                .arg(&neox)
                .arg(&kc)
                .arg(&vc)
                .arg(&kv_row)
                .launch(cfg((heads, self.step.t as u32, 1), block))?;
        }
        for b in [Buf::Q, Buf::K, Buf::V] {
            self.wrote(b);
        }
        Ok(())
    }

    /// RoPE's arguments to the epilogue kernels: theta's factor a dimension pair
    /// (`base^(-2 / rope_dim)`) and whether the layout is NeoX's (1) or the normal one (0).
    fn rotation(&self) -> (f32, i32) {
        let c = &self.config;
        let neox = c.rope_layout == kestrel_models::RopeLayout::NeoX;
        (c.rope_base.powf(-2.0 / c.rope_dim as f32), neox as i32)
    }

    /// The K and V caches of layer `layer` (device addresses).
    fn kv_cache(&self, layer: usize) -> (u64, u64) {
        let kv = self.config.kv_layer(layer);
        (self.kv.k_layer(kv), self.kv.v_layer(kv))
    }

    pub(crate) fn record(&mut self, stage: u8, edit: impl FnOnce(&mut Pending)) -> Result<()> {
        if stage < self.step.pending.stage {
            self.flush()?;
        }
        if !self.qkv_deferred() {
            self.flush_mm()?;
        }
        let p = &mut self.step.pending;
        edit(p);
        p.stage = p.stage.max(stage);
        Ok(())
    }
}
