//! The recurrent state of hybrid models, kept apart from the model like the KV pool: a pool of
//! fixed-size slots, one per running sequence (and, in the serving engine, one per snapshot).
//!
//! A slot holds, for every gated-DeltaNet layer in order, the convolution window (the last
//! `conv_kernel - 1` inputs of the layer's convolution, `[K-1, channels]`, oldest first) and
//! the state matrices (`[n_v_heads, head_k_dim, head_v_dim]`), all f32. A slot is one
//! contiguous run of floats, so a snapshot is one copy ([`StatePool::copy_slot`]), and its
//! size is known from the config alone ([`StatePool::slot_bytes`]) for the memory plan.
//!
//! Unlike K/V, the state after `n` positions cannot be cut back to `m < n`: a sequence resumes
//! only from a slot that holds exactly its prefix. A step that starts at position 0 clears the
//! slot first, so a fresh sequence needs no explicit reset.

use crate::config::ModelConfig;
use crate::deltanet::DeltaNetConfig;

pub struct StatePool {
    data: Vec<f32>,
    /// Floats of one layer's convolution window and of its state matrices.
    conv_floats: usize,
    ssm_floats: usize,
    /// DeltaNet layers per slot.
    n_layers: usize,
    n_slots: usize,
}

impl StatePool {
    /// `n_slots` cleared slots for `cfg`; a model without recurrent layers gets empty slots.
    pub fn new(cfg: &ModelConfig, n_slots: usize) -> Self {
        let (conv_floats, ssm_floats, n_layers) = match &cfg.hybrid {
            Some(h) => (h.conv_floats(), h.ssm_floats(), h.n_recurrent()),
            None => (0, 0, 0),
        };
        let slot = n_layers * (conv_floats + ssm_floats);
        Self {
            data: vec![0.0; slot * n_slots],
            conv_floats,
            ssm_floats,
            n_layers,
            n_slots,
        }
    }

    /// A pool with no slots (models without recurrent layers).
    pub fn empty() -> Self {
        Self {
            data: Vec::new(),
            conv_floats: 0,
            ssm_floats: 0,
            n_layers: 0,
            n_slots: 0,
        }
    }

    /// Bytes of one slot for `cfg` (0 without recurrent layers).
    pub fn slot_bytes(cfg: &ModelConfig) -> usize {
        cfg.hybrid.as_ref().map_or(0, DeltaNetConfig::state_bytes)
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    fn slot_floats(&self) -> usize {
        self.n_layers * (self.conv_floats + self.ssm_floats)
    }

    /// Whether this pool has state to keep (the model has recurrent layers).
    pub fn is_stateful(&self) -> bool {
        self.slot_floats() > 0
    }

    /// The floats of slot `s` (every layer's window and state, in order).
    pub fn slot(&self, s: usize) -> &[f32] {
        let n = self.slot_floats();
        &self.data[s * n..(s + 1) * n]
    }

    pub fn slot_mut(&mut self, s: usize) -> &mut [f32] {
        let n = self.slot_floats();
        &mut self.data[s * n..(s + 1) * n]
    }

    /// Clears slot `s`: the state before position 0.
    pub fn reset(&mut self, s: usize) {
        self.slot_mut(s).fill(0.0);
    }

    /// Copies slot `src` into slot `dst` (a snapshot, or a resume from one).
    pub fn copy_slot(&mut self, src: usize, dst: usize) {
        if src == dst {
            return;
        }
        let n = self.slot_floats();
        self.data.copy_within(src * n..(src + 1) * n, dst * n);
    }

    /// Read-only [`StatePool::layer_mut`].
    pub fn layer(&self, s: usize, r: usize) -> (&[f32], &[f32]) {
        let per_layer = self.conv_floats + self.ssm_floats;
        let at = s * self.slot_floats() + r * per_layer;
        self.data[at..at + per_layer].split_at(self.conv_floats)
    }

    /// The convolution window and state matrices of DeltaNet layer `r` (counted among the
    /// recurrent layers only) in slot `s`.
    pub fn layer_mut(&mut self, s: usize, r: usize) -> (&mut [f32], &mut [f32]) {
        let per_layer = self.conv_floats + self.ssm_floats;
        let at = s * self.slot_floats() + r * per_layer;
        let (conv, ssm) = self.data[at..at + per_layer].split_at_mut(self.conv_floats);
        (conv, ssm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deltanet::HeadGrouping;

    fn cfg() -> ModelConfig {
        ModelConfig {
            arch: crate::Arch::Qwen35,
            n_layers: 4,
            dim: 8,
            ffn_dim: 8,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 8,
            vocab_size: 8,
            rms_eps: 1e-6,
            rope_base: 1e4,
            rope_dim: 2,
            rope_layout: crate::RopeLayout::NeoX,
            max_context: 16,
            hybrid: Some(DeltaNetConfig {
                recurrent: vec![true, true, true, false],
                conv_kernel: 4,
                n_k_heads: 1,
                n_v_heads: 2,
                head_k_dim: 2,
                head_v_dim: 3,
                grouping: HeadGrouping::Grouped,
            }),
            moe: None,
        }
    }

    #[test]
    fn slots_are_sized_from_the_config_and_copy_whole() {
        let c = cfg();
        // per layer: window 3 x (2 + 2 + 6) = 30, states 2 x 2 x 3 = 12; three layers
        assert_eq!(StatePool::slot_bytes(&c), 4 * 3 * 42);
        let mut p = StatePool::new(&c, 3);
        let (conv, ssm) = p.layer_mut(1, 2);
        assert_eq!((conv.len(), ssm.len()), (30, 12));
        conv[0] = 1.0;
        ssm[11] = 2.0;
        p.copy_slot(1, 2);
        assert_eq!(p.slot(2), p.slot(1));
        assert!(p.slot(0).iter().all(|&v| v == 0.0));
        p.reset(1);
        assert!(p.slot(1).iter().all(|&v| v == 0.0));
        assert_eq!(p.slot(2).iter().sum::<f32>(), 3.0);
    }
}
