//! The CUDA backend's [`HybridOps`] (Qwen3.5's gated attention and gated DeltaNet), kernels in
//! `kernels/deltanet.cu`. As in [`crate::ops`], every operation only enqueues work, so hybrid
//! decode steps are captured into CUDA graphs like the dense models'.

use crate::error::{CudaError, Result};
use crate::model::CudaModel;
use crate::ops::{cfg, prompt_step};
use cudarc::driver::PushKernelArg;
use kestrel_models::backend::{Buf, HybridOps, Param, W};
use kestrel_models::deltanet::{DeltaNetConfig, HeadGrouping};

/// Whether a step runs the delta rule in its chunked form: prompt steps
/// ([`crate::ops::prompt_step`]), unless `KESTREL_CUDA_CHUNKED=0` (A/B figures).
fn chunked_rule(t: usize, n_seqs: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    prompt_step(t, n_seqs) && crate::ops::switch_on(&ON, "KESTREL_CUDA_CHUNKED")
}

impl CudaModel {
    fn hybrid_cfg(&self) -> Result<DeltaNetConfig> {
        self.config
            .hybrid
            .clone()
            .ok_or_else(|| CudaError::Other("a DeltaNet operation on a dense model".into()))
    }

    /// Offset (floats) of DeltaNet layer `layer`'s part of a slot: its window, then its state.
    fn state_offset(&self, layer: usize) -> Result<u64> {
        let r = self
            .state
            .recurrent_index
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| CudaError::Other(format!("layer {layer} has no recurrent state")))?;
        Ok((r * self.state.per_layer) as u64)
    }

    fn seq_args(&self) -> (u64, u64, u64) {
        let s = &self.scratch;
        (s.seq_t0.ptr, s.seq_len.ptr, s.seq_slot.ptr)
    }
}

impl HybridOps for CudaModel {
    fn mul_sigmoid(&mut self, x: Buf, gate: Buf) -> Result<()> {
        self.flush()?;
        let (xp, n) = self.buf(x);
        let (gp, _) = self.buf(gate);
        let total = (self.rows(x) * n) as u64;
        let (q, qd) = self.quantized_output(x);
        let f = self.gpu.func("mul_sigmoid")?;
        // SAFETY: arguments match the kernel's signature; buffers are sized for this step.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&xp)
                .arg(&gp)
                .arg(&total)
                .arg(&q)
                .arg(&qd)
                .launch(cfg((total.div_ceil(256) as u32, 1, 1), 256))?;
        }
        self.wrote(x);
        if q != 0 {
            self.step.q8_of = Some(x);
        }
        Ok(())
    }

    fn conv_silu(&mut self, layer: usize, x: Buf, out: Buf) -> Result<()> {
        self.flush()?;
        let h = self.hybrid_cfg()?;
        let (xp, ch) = self.buf(x);
        let (op, _) = self.buf(out);
        let taps = self.vector(W::Layer(layer, Param::SsmConv))?;
        let (chi, k) = (ch as i32, h.conv_kernel as i32);
        let (states, slot_floats) = (self.state.buf.ptr, self.state.slot_floats as u64);
        let off = self.state_offset(layer)?;
        let (t0, len, slot) = self.seq_args();
        let (n_seqs, blocks) = (self.step.n_seqs as u32, ch.div_ceil(256) as u32);
        // prompt steps: one thread per channel and run of 16 tokens, then the window slides;
        // decode steps: one thread per channel over its sequence's few tokens
        let prompt = prompt_step(self.step.t, self.step.n_seqs);
        let f = self.gpu.func(if prompt {
            "conv_silu_par"
        } else {
            "conv_silu_seq"
        })?;
        let runs = if prompt {
            self.step.t.div_ceil(16) as u32
        } else {
            1
        };
        // SAFETY: as in mul_sigmoid; every sequence's slot was checked against n_slots.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&xp)
                .arg(&op)
                .arg(&taps)
                .arg(&chi)
                .arg(&k)
                .arg(&states)
                .arg(&slot_floats)
                .arg(&off)
                .arg(&t0)
                .arg(&len)
                .arg(&slot)
                .launch(cfg((n_seqs, blocks, runs), 256))?;
        }
        if prompt {
            let w = self.gpu.func("conv_window")?;
            // SAFETY: as above; launched after the outputs, which read the old window.
            unsafe {
                self.gpu
                    .stream
                    .launch_builder(&w)
                    .arg(&xp)
                    .arg(&chi)
                    .arg(&k)
                    .arg(&states)
                    .arg(&slot_floats)
                    .arg(&off)
                    .arg(&t0)
                    .arg(&len)
                    .arg(&slot)
                    .launch(cfg((n_seqs, blocks, 1), 256))?;
            }
        }
        self.wrote(out);
        Ok(())
    }

    fn delta_rule(
        &mut self,
        layer: usize,
        conv: Buf,
        alpha: Buf,
        beta: Buf,
        out: Buf,
    ) -> Result<()> {
        self.flush()?;
        let h = self.hybrid_cfg()?;
        let (cp, ch) = self.buf(conv);
        let (ap, _) = self.buf(alpha);
        let (bp, _) = self.buf(beta);
        let (op, _) = self.buf(out);
        let a = self.vector(W::Layer(layer, Param::SsmA))?;
        let dt = self.vector(W::Layer(layer, Param::SsmDtBias))?;
        let (chi, nk, nv, dv) = (
            ch as i32,
            h.n_k_heads as i32,
            h.n_v_heads as i32,
            h.head_v_dim as i32,
        );
        let key_dim = h.key_dim() as i32;
        let tiled = (h.grouping == HeadGrouping::Tiled) as i32;
        let (states, slot_floats) = (self.state.buf.ptr, self.state.slot_floats as u64);
        let off = self.state_offset(layer)? + self.state.conv_floats as u64;
        let (t0, len, slot) = self.seq_args();
        // prompt steps: the chunked form, a block of 256 threads per 32 value columns of a head;
        // decode steps: the recurrence, a block of 128 threads per 32 columns, four a column
        // (kernels/deltanet.cu)
        let chunked = chunked_rule(self.step.t, self.step.n_seqs);
        let rule = self.gpu.func(&format!(
            "{}_{}",
            if chunked {
                "delta_chunked"
            } else {
                "delta_rule"
            },
            h.head_k_dim
        ))?;
        let col_blocks = h.head_v_dim.div_ceil(32) as u32;
        // SAFETY: as in conv_silu.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&rule)
                .arg(&cp)
                .arg(&chi)
                .arg(&key_dim)
                .arg(&ap)
                .arg(&bp)
                .arg(&a)
                .arg(&dt)
                .arg(&nv)
                .arg(&nk)
                .arg(&dv)
                .arg(&tiled)
                .arg(&op)
                .arg(&states)
                .arg(&slot_floats)
                .arg(&off)
                .arg(&t0)
                .arg(&len)
                .arg(&slot)
                .launch(cfg(
                    (self.step.n_seqs as u32, h.n_v_heads as u32, col_blocks),
                    if chunked { 256 } else { 128 },
                ))?;
        }
        self.wrote(out);
        Ok(())
    }

    fn gated_norm(&mut self, x: Buf, z: Buf, w: W) -> Result<()> {
        self.flush()?;
        let h = self.hybrid_cfg()?;
        let (xp, _) = self.buf(x);
        let (zp, _) = self.buf(z);
        let wp = self.vector(w)?;
        let (dv, eps) = (h.head_v_dim as i32, self.config.rms_eps);
        let f = self.gpu.func("gated_norm")?;
        let block = (h.head_v_dim.div_ceil(32) * 32) as u32;
        let (q, qd) = if h.head_v_dim.is_multiple_of(32) {
            self.quantized_output(x)
        } else {
            (0, 0)
        };
        // SAFETY: as in mul_sigmoid.
        unsafe {
            self.gpu
                .stream
                .launch_builder(&f)
                .arg(&xp)
                .arg(&zp)
                .arg(&wp)
                .arg(&dv)
                .arg(&eps)
                .arg(&q)
                .arg(&qd)
                .launch(cfg((self.step.t as u32, h.n_v_heads as u32, 1), block))?;
        }
        self.wrote(x);
        if q != 0 {
            self.step.q8_of = Some(x);
        }
        Ok(())
    }
}
