//! `--spec off|lookup|draft`, `--draft-model FILE`, `--spec-k N`: speculative decoding for
//! run, chat, serve and bench.

use crate::gpu::Device;
use crate::source::ModelSource;
use anyhow::{bail, Result};
use kestrel_engine::{SpecConfig, SpecMode};
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: off; lookup (proposals copied from earlier in the prompt or
    /// output: no second model); or draft (a small model of the same vocabulary proposes,
    /// --draft-model). Greedy output is unchanged; sampling keeps its distribution.
    #[arg(long, default_value = "off", value_parser = parse_mode)]
    pub spec: SpecMode,
    /// The draft model for --spec draft (e.g. Qwen2.5-Coder-0.5B for the 1.5B); its K/V is
    /// counted in the memory plan.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Most tokens proposed per step (adapted to the recent acceptance) [default: 8 with
    /// lookup, 16 with a draft model]
    #[arg(long)]
    pub spec_k: Option<usize>,
}

/// `--spec-k` left out: prompt lookup proposes up to 8 (a longer match rarely holds on), a draft
/// model up to 16. The draft's proposals are mostly kept where it pays (a code edit: 98% of 8
/// kept, BENCHMARKS.md), and the verification pass is the larger share of a step there, so more
/// proposals per pass pay: 1.15x plain decoding with 8, 1.35x with 16 (Qwen2.5-Coder-1.5B over
/// the 0.5B, 2 threads, Xeon VM, 2026-12-02).
fn default_k(mode: SpecMode) -> usize {
    match mode {
        SpecMode::Draft => 16,
        _ => 8,
    }
}

fn parse_mode(s: &str) -> Result<SpecMode, String> {
    s.parse()
}

impl SpecArgs {
    /// The engine's speculation settings, checked against each other.
    pub fn config(&self) -> Result<SpecConfig> {
        match (self.spec, &self.draft_model) {
            (SpecMode::Draft, None) => bail!("--spec draft needs --draft-model FILE"),
            (SpecMode::Off | SpecMode::Lookup, Some(_)) => {
                bail!("--draft-model is used only with --spec draft")
            }
            _ => {}
        }
        let k = self.spec_k.unwrap_or(default_k(self.spec));
        if !(1..=32).contains(&k) {
            bail!("--spec-k must be between 1 and 32");
        }
        Ok(SpecConfig {
            mode: self.spec,
            k,
            ..SpecConfig::default()
        })
    }

    /// Says (unless `quiet`) how many of the plan's state snapshot slots speculation takes as
    /// backups of speculating sequences' recurrent states (hybrid models: the state before a
    /// verify pass, restored after a rejection), so the snapshot count printed with the memory
    /// plan is not all for prefix reuse.
    pub fn note_backups(&self, plan: &kestrel_engine::PoolPlan, quiet: bool) -> Result<()> {
        let backups = self.config()?.backup_slots(plan.snapshot_slots);
        if backups > 0 && !quiet {
            eprintln!(
                "speculation: {backups} of the {} state snapshot slots hold speculating sequences' states before their verify passes",
                plan.snapshot_slots
            );
        }
        Ok(())
    }

    /// Where the model runs with these settings: speculation runs on the CPU backend for now
    /// (an explicit `--device cuda` is refused, `auto` stays on the CPU, saying so unless
    /// `quiet`). On the GPU the verification pass goes through the multi-token mat-mat, whose
    /// rounding differs from the one-token mat-vec enough that greedy output would not be
    /// plain greedy's token for token (seen on random-weight files, whose logits are flat).
    pub fn device(&self, device: Device, quiet: bool) -> Result<Device> {
        if self.spec == SpecMode::Off {
            return Ok(device);
        }
        match device {
            Device::Cuda(_) => bail!(
                "--spec runs on the CPU backend for now (use --device cpu): on the GPU the verification pass would not give plain decoding's tokens exactly"
            ),
            Device::Auto => {
                if !quiet {
                    eprintln!("device: cpu (--spec runs on the CPU backend for now)");
                }
                Ok(Device::Cpu)
            }
            Device::Cpu => Ok(Device::Cpu),
        }
    }

    /// Opens the draft model and checks that it shares `target`'s vocabulary.
    pub fn open_draft(&self, target: &ModelSource) -> Result<Option<ModelSource>> {
        let Some(path) = self
            .draft_model
            .as_ref()
            .filter(|_| self.spec == SpecMode::Draft)
        else {
            return Ok(None);
        };
        let draft = ModelSource::open(path)?;
        if draft.config.hybrid.is_some() {
            bail!(
                "the draft model {} keeps a recurrent state (hybrid layers): a draft's rejected \
                 proposals must be cut from its cache, which a recurrent state cannot be \
                 rolled back to; use a dense draft of the same vocabulary, or --spec lookup",
                path.display()
            );
        }
        check_same_vocabulary(target, &draft)?;
        Ok(Some(draft.into_draft()))
    }
}

/// The draft's token ids must mean what the target's mean: same vocabulary size (the logits
/// rows are compared id by id), same end-of-generation tokens, and the same tokens for a
/// probe text with code, prose and specials.
fn check_same_vocabulary(target: &ModelSource, draft: &ModelSource) -> Result<()> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    let name = |s: &ModelSource| s.path.display().to_string();
    if target.config.vocab_size != draft.config.vocab_size {
        bail!(
            "the draft model {} has {} vocabulary entries, {} has {}: a draft must share the model's vocabulary",
            name(draft),
            draft.config.vocab_size,
            name(target),
            target.config.vocab_size
        );
    }
    const PROBE: &str = "def add(a, b):\n    return a + b  # naïve, 中文 <|im_end|>";
    let same_probe = t.encode(PROBE, false, true)? == d.encode(PROBE, false, true)?;
    if !same_probe || t.eog_ids() != d.eog_ids() {
        bail!(
            "the draft model {} tokenizes differently from {}: a draft must share the model's vocabulary",
            name(draft),
            name(target)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(spec: SpecMode, draft: bool, k: Option<usize>) -> SpecArgs {
        SpecArgs {
            spec,
            draft_model: draft.then(|| PathBuf::from("draft.gguf")),
            spec_k: k,
        }
    }

    #[test]
    fn k_defaults_by_mode_and_an_explicit_one_wins() {
        let k = |a: SpecArgs| a.config().map(|c| c.k).ok();
        assert_eq!(k(args(SpecMode::Lookup, false, None)), Some(8));
        assert_eq!(k(args(SpecMode::Draft, true, None)), Some(16));
        assert_eq!(k(args(SpecMode::Draft, true, Some(4))), Some(4));
        assert!(args(SpecMode::Lookup, false, Some(33)).config().is_err());
        assert!(args(SpecMode::Draft, false, None).config().is_err());
    }
}
