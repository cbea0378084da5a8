//! Speculative decoding, the scheduler half. A decoding sequence's step grows from its one
//! pending token to that token plus `k` proposals; the target model runs them all in one
//! forward pass (reading the weights once) and returns logits for each; the proposals are
//! checked in order with the request's sampling rule (`kestrel_sampler::speculative`) and the
//! first rejected one is replaced. The rejected positions are rolled back by moving
//! `computed` back: their K/V stay in the sequence's own blocks as garbage that the next step
//! overwrites before anything reads it, and blocks enter the prefix index only up to
//! `computed`, so the index never holds a rejected token.
//!
//! Proposals come from the sequence itself (n-gram lookup, `speculative.rs`) or from a draft
//! model that shares the target's block ids: its K/V pool has as many blocks, and every
//! prefill chunk of the target runs on it too, so a block holds both models' K/V of the same
//! tokens. Decode steps taken while speculation pauses do not run the draft: its next round
//! catches up over those tokens, but a block finished in that stretch and reused by another
//! request from the prefix cache holds no draft K/V, which only makes that request's proposals
//! worse (every kept token is still the target's own choice).
//!
//! A hybrid model's recurrent state cannot be cut back like K/V: a speculating sequence's state
//! slot is copied into a spare slot (`spec_slots`) before the verify pass, and after a
//! rejection it is restored and the kept tokens run again (no logits) to bring it to
//! `computed`. A step that keeps every proposal needs neither.

use kestrel_sampler::Verdict;

use super::{Outcome, Planned, Scheduler};
use crate::config::SpecMode;
use crate::model::SeqStep;
use crate::speculative::lookup;

impl Scheduler<'_> {
    /// Decides how many tokens each decoding sequence proposes this step and grows its planned
    /// step accordingly. Lookup proposals are appended to the sequence's tokens here; draft
    /// proposals by [`Scheduler::draft`] once the blocks are handed out.
    pub(super) fn plan_speculation(&mut self, plan: &mut [Planned]) {
        let mode = self.cfg.spec.mode;
        let decoding = plan.iter().filter(|p| !p.prefill).count();
        if mode == SpecMode::Off || decoding == 0 || decoding > self.cfg.spec.max_batch {
            return;
        }
        let planned: usize = plan.iter().map(|p| p.len).sum();
        let mut budget = self.cfg.step_token_budget.saturating_sub(planned);
        // a hybrid model's speculating sequences each need a slot to back their state up in
        let mut backups = if self.running_slots > 0 {
            self.spec_slots.len()
        } else {
            usize::MAX
        };
        for p in plan.iter_mut().filter(|p| !p.prefill) {
            let seq = &mut self.running[p.seq];
            if seq.spec.pause > 0 {
                seq.spec.pause -= 1;
                continue;
            }
            if backups == 0 {
                continue;
            }
            // The last proposal accepted plus the token after it must stay within max_tokens
            // (and so within the blocks reserved at admission).
            let room = seq.max_tokens.saturating_sub(seq.generated() + 1);
            let k = seq.spec.k.min(room).min(budget);
            let n = match mode {
                SpecMode::Lookup => {
                    let proposal = lookup(&seq.tokens, k);
                    seq.tokens.extend_from_slice(&proposal);
                    proposal.len()
                }
                SpecMode::Draft if self.draft.is_some() => k,
                SpecMode::Draft => 0,
                SpecMode::Off => 0,
            };
            p.len += n;
            p.drafts = n;
            budget -= n;
            if n > 0 {
                backups -= 1;
            }
        }
    }

    /// Hybrid models: copies the state of every sequence that verifies proposals this step
    /// into a spare slot (by plan index; None: nothing backed up).
    pub(super) fn back_up_states(&mut self, plan: &[Planned]) -> Vec<Option<u32>> {
        let mut spare = self.spec_slots.iter().copied();
        plan.iter()
            .map(|p| {
                if self.running_slots == 0 || p.drafts == 0 {
                    return None;
                }
                let backup = spare.next()?;
                self.model.copy_state(self.running[p.seq].slot, backup);
                Some(backup)
            })
            .collect()
    }

    /// Hybrid models, after verification: a sequence that rejected a proposal gets its state
    /// back from before the verify pass and runs its kept tokens again (one forward call for
    /// all of them, no logits), so its state ends at `computed` like its K/V. A failure fails
    /// those requests.
    pub(super) fn restore_states(
        &mut self,
        plan: &[Planned],
        backups: &[Option<u32>],
        outcomes: &mut [Option<Outcome>],
    ) {
        let bs = self.cfg.block_size;
        let redo: Vec<&Planned> = plan
            .iter()
            .zip(backups)
            .filter_map(|(p, b)| {
                let seq = &self.running[p.seq];
                let rejected = seq.computed < p.start + p.len;
                let b = b.filter(|_| rejected && outcomes[p.seq].is_none())?;
                self.model.copy_state(b, seq.slot);
                Some(p)
            })
            .collect();
        if redo.is_empty() {
            return;
        }
        let steps: Vec<SeqStep<'_>> = redo
            .iter()
            .map(|p| {
                let seq = &self.running[p.seq];
                SeqStep {
                    tokens: &seq.tokens[p.start..seq.computed],
                    start: p.start,
                    blocks: &seq.blocks[..seq.computed.div_ceil(bs)],
                    want_logits: false,
                    all_logits: false,
                    slot: seq.slot,
                    argmax_only: false,
                }
            })
            .collect();
        let t0 = std::time::Instant::now();
        let result = super::forward_guarded(
            self.model.as_mut(),
            &steps,
            &mut crate::model::Logits::default(),
        );
        self.counters.forward_ns += t0.elapsed().as_nanos() as u64;
        self.counters.spec_redone_tokens +=
            steps.iter().map(|s| s.tokens.len() as u64).sum::<u64>();
        drop(steps);
        if let Err(e) = result {
            for p in redo {
                outcomes[p.seq] = Some(Outcome::Failed(format!("model error: {e}")));
            }
        }
    }

    /// Draft mode: runs the draft model `drafts` times, one token per sequence each time
    /// (batched over the sequences), appending each drawn proposal and the distribution it was
    /// drawn from. The first run also catches the draft up on tokens it has not seen. A draft
    /// failure drops this step's proposals (plain decoding instead).
    pub(super) fn draft(&mut self, plan: &mut [Planned]) {
        let Some(draft) = self.draft.as_mut() else {
            return;
        };
        let bs = self.cfg.block_size;
        let rounds = plan.iter().map(|p| p.drafts).max().unwrap_or(0);
        for r in 0..rounds {
            let active: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].drafts > r).collect();
            let spans: Vec<(usize, usize)> = active
                .iter()
                .map(|&i| {
                    let p = &plan[i];
                    let seq = &self.running[p.seq];
                    // Round 0 runs from where the draft stands up to the pending token; later
                    // rounds run the proposal drawn in the round before.
                    let from = if r == 0 {
                        seq.spec.draft_computed.min(p.start)
                    } else {
                        p.start + r
                    };
                    (from, p.start + r + 1)
                })
                .collect();
            let steps: Vec<SeqStep<'_>> = active
                .iter()
                .zip(&spans)
                .map(|(&i, &(from, to))| {
                    let seq = &self.running[plan[i].seq];
                    SeqStep {
                        tokens: &seq.tokens[from..to],
                        start: from,
                        blocks: &seq.blocks[..to.div_ceil(bs)],
                        want_logits: true,
                        all_logits: false,
                        slot: 0,
                        argmax_only: false,
                    }
                })
                .collect();
            let mut logits = crate::model::Logits::default();
            match draft.forward(&steps, &mut logits) {
                Ok(()) if logits.rows().len() == steps.len() * self.vocab => {}
                _ => {
                    drop(steps);
                    return self.drop_drafts(plan);
                }
            };
            drop(steps);
            for ((&i, &(_, to)), l) in active
                .iter()
                .zip(&spans)
                .zip(logits.rows().chunks(self.vocab))
            {
                let seq = &mut self.running[plan[i].seq];
                seq.spec.draft_computed = to;
                let Some(sampler) = seq.spec.draft_sampler.as_mut() else {
                    continue;
                };
                let q = sampler.distribution(l, &seq.tokens);
                let token = sampler.draw(&q);
                seq.tokens.push(token);
                seq.spec.drafts_q.push(q);
            }
        }
    }

    /// Takes back this step's draft proposals (the sequences decode one token instead).
    fn drop_drafts(&mut self, plan: &mut [Planned]) {
        for p in plan.iter_mut().filter(|p| p.drafts > 0) {
            let seq = &mut self.running[p.seq];
            let drawn = seq.spec.drafts_q.len();
            seq.tokens.truncate(seq.tokens.len() - drawn);
            seq.spec.drafts_q.clear();
            seq.spec.draft_computed = seq.spec.draft_computed.min(p.start);
            p.len -= p.drafts;
            p.drafts = 0;
        }
    }

    /// Draft mode: runs the draft model over this step's prefill chunks so its K/V cover the
    /// prompt as the target's do. A failure fails those requests.
    pub(super) fn draft_prefill(&mut self, plan: &[Planned], outcomes: &mut [Option<Outcome>]) {
        let Some(draft) = self.draft.as_mut() else {
            return;
        };
        let bs = self.cfg.block_size;
        let prefills: Vec<&Planned> = plan.iter().filter(|p| p.prefill).collect();
        if prefills.is_empty() {
            return;
        }
        let steps: Vec<SeqStep<'_>> = prefills
            .iter()
            .map(|p| {
                let seq = &self.running[p.seq];
                let end = p.start + p.len;
                SeqStep {
                    tokens: &seq.tokens[p.start..end],
                    start: p.start,
                    blocks: &seq.blocks[..end.div_ceil(bs)],
                    want_logits: false,
                    all_logits: false,
                    slot: 0,
                    argmax_only: false,
                }
            })
            .collect();
        let result = draft.forward(&steps, &mut crate::model::Logits::default());
        drop(steps);
        for p in prefills {
            match &result {
                Ok(_) => self.running[p.seq].spec.draft_computed = p.start + p.len,
                Err(e) => {
                    outcomes[p.seq] = Some(Outcome::Failed(format!("draft model error: {e}")))
                }
            }
        }
    }

    /// Checks sequence `p.seq`'s proposals against the target's logits (`rows`: one per token
    /// of the step), streams the tokens kept and the replacement (or the bonus token after a
    /// fully accepted run), and moves `computed` to the last position whose K/V hold a kept
    /// token. Returns how the request ended, if it did.
    pub(super) fn verify(
        &mut self,
        p: &Planned,
        rows: &[f32],
    ) -> Option<crate::request::FinishReason> {
        let vocab = self.vocab;
        let seq = &mut self.running[p.seq];
        let drafts = seq.tokens.split_off(seq.tokens.len() - p.drafts);
        let qs = std::mem::take(&mut seq.spec.drafts_q);
        let mut accepted = 0;
        let mut finish = None;
        for (i, l) in rows.chunks(vocab).enumerate().take(p.drafts + 1) {
            let (id, kept) = match drafts.get(i) {
                Some(&x) => match seq.sampler.verify(l, &seq.tokens, x, qs.get(i)) {
                    Verdict::Accepted => (x, true),
                    Verdict::Rejected(r) => (r, false),
                },
                None => (seq.sampler.sample(l, &seq.tokens), false),
            };
            accepted += usize::from(kept);
            self.counters.generated_tokens += 1;
            finish = seq.emit(id, l, &self.eog);
            if finish.is_some() || !kept {
                break;
            }
        }
        seq.computed = p.start + 1 + accepted;
        seq.spec.draft_computed = seq.spec.draft_computed.min(seq.computed);
        seq.spec.record(p.drafts, accepted);
        self.counters.spec_steps += 1;
        self.counters.spec_proposed += p.drafts as u64;
        self.counters.spec_accepted += accepted as u64;
        finish
    }
}
