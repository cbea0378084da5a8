//! The scheduler: admission, step planning (decodes + prefill chunks), one forward call per
//! step, sampling, cancellation and retirement. Synchronous and single-threaded; the engine
//! thread (`engine.rs`) drives it. Recurrent-state slots and snapshots of hybrid models:
//! `scheduler/state.rs`.

mod admit;
mod speculate;
mod state;

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use kestrel_tokenizer::Tokenizer;

use crate::blocks::{BlockPool, ROOT_HASH};
use crate::config::EngineConfig;
use crate::model::{Logits, SeqStep, StepModel};
use crate::request::{Event, FinishReason};
use crate::sequence::{Pending, Sequence};
use crate::stats::EngineStats;

/// How a sequence leaves the running set.
enum Outcome {
    Finished(FinishReason),
    Failed(String),
}

/// What an admitted prompt takes from the prefix cache.
struct Reuse {
    /// Blocks shared as they are (one reference each).
    shared: Vec<u32>,
    /// Chain hashes of `shared`.
    hashes: Vec<u64>,
    /// A block whose first `n` positions are copied into a private block that continues the
    /// sequence (a whole-prompt hit, or a hybrid model's tail entry).
    copy: Option<(u32, usize)>,
    /// The snapshot slot to resume the recurrent state from (hybrid models).
    state: Option<u32>,
    /// Positions reused when everything above is had.
    pos: usize,
    /// The whole prompt reused (hybrid models): its last position's logits, kept with the
    /// snapshot, from which the first token is sampled at admission.
    logits: Option<Vec<f32>>,
}

/// One sequence's share of the step being planned.
struct Planned {
    seq: usize,
    start: usize,
    len: usize,
    want_logits: bool,
    prefill: bool,
    /// Speculative proposals at the end of a decode step (`len` = 1 + drafts); their logits
    /// are all wanted.
    drafts: usize,
}

pub(crate) struct Scheduler<'t> {
    model: Box<dyn StepModel>,
    /// Speculative decoding's draft model (same vocabulary and block ids as `model`).
    draft: Option<Box<dyn StepModel>>,
    tokenizer: &'t Tokenizer,
    cfg: EngineConfig,
    pool: BlockPool,
    vocab: usize,
    eog: Vec<u32>,
    queue: VecDeque<Pending>,
    /// Admitted sequences, in admission order (older prefills get the step budget first).
    running: Vec<Sequence<'t>>,
    /// Blocks promised to running sequences and not handed out yet. Invariant:
    /// `reserved <= pool.available()`.
    reserved: usize,
    /// Hybrid models: recurrent-state slots free for running sequences (the snapshot slots
    /// are the block pool's). Empty for other models.
    free_slots: Vec<u32>,
    /// Running-sequence state slots (0 for models without recurrent state).
    running_slots: usize,
    /// Hybrid models with speculation: the slots a speculating sequence's state is copied
    /// into before its verify pass and restored from after a rejection (taken from the
    /// snapshot slots, one per sequence that may speculate in a step).
    spec_slots: Vec<u32>,
    /// Counters (occupancy fields are filled in by `stats`).
    counters: EngineStats,
    /// The logits of the last step, kept to be reused by the next (no allocation per step), in
    /// the memory the model asked for.
    logits: Logits,
    /// Threads a step's sampling may spread over (the machine's, asked once: on Linux the
    /// question reads cgroup files, ~0.1 ms, which every step had paid).
    sample_threads: usize,
}

/// `model.forward`, a panic in it turned into the step's error (the engine thread lives on).
fn forward_guarded(
    model: &mut dyn StepModel,
    steps: &[SeqStep<'_>],
    logits: &mut Logits,
) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| model.forward(steps, logits)))
        .unwrap_or_else(|_| Err("model panicked in forward".to_string()))
}

/// Whether a planned step of `seq` needs only the argmax of its logits row: a sampled row
/// (not a verification) of a sequence that picks greedily and reads nothing else, and not the
/// end of a hybrid model's prompt (`hybrid`: its snapshot keeps the prompt's last logits).
fn argmax_only(p: &Planned, seq: &Sequence<'_>, hybrid: bool) -> bool {
    p.want_logits && p.drafts == 0 && !(p.prefill && hybrid) && seq.argmax_suffices()
}

impl<'t> Scheduler<'t> {
    pub fn new(
        model: Box<dyn StepModel>,
        draft: Option<Box<dyn StepModel>>,
        tokenizer: &'t Tokenizer,
        cfg: EngineConfig,
    ) -> Self {
        let mut pool = BlockPool::new(model.kv_blocks(), cfg.block_size);
        let state_slots = model.state_slots();
        let running_slots = cfg.max_running.min(state_slots);
        let logits = model
            .logits_memory()
            .map(Logits::with_memory)
            .unwrap_or_default();
        let spec_slots = cfg.spec.backup_slots(state_slots - running_slots);
        if state_slots > 0 {
            let first_snapshot = running_slots + spec_slots;
            pool = pool.with_snapshots(first_snapshot as u32, state_slots - first_snapshot);
        }
        Self {
            free_slots: (0..running_slots as u32).rev().collect(),
            running_slots,
            spec_slots: (running_slots..running_slots + spec_slots)
                .map(|s| s as u32)
                .collect(),
            vocab: model.vocab_size(),
            eog: tokenizer.eog_ids().to_vec(),
            model,
            draft,
            tokenizer,
            cfg,
            pool,
            queue: VecDeque::new(),
            running: Vec::new(),
            reserved: 0,
            counters: EngineStats::default(),
            logits,
            sample_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    pub fn enqueue(&mut self, p: Pending) {
        self.counters.requests += 1;
        self.queue.push_back(p);
    }

    pub fn has_work(&self) -> bool {
        !self.queue.is_empty() || !self.running.is_empty()
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            blocks_total: self.pool.n_blocks(),
            blocks_free: self.pool.free_count(),
            blocks_used: self.pool.used_count(),
            blocks_cached: self.pool.cached_count(),
            blocks_reserved: self.reserved,
            queue_depth: self.queue.len(),
            running: self.running.len(),
            snapshots_total: self.pool.snapshot_slots(),
            snapshots_used: self.pool.snapshots_used(),
            snapshots_evicted: self.pool.snapshots_evicted(),
            ..self.counters.clone()
        }
    }

    /// With no work left: no reservation, every block free or cached, none referenced.
    pub fn check_idle(&self) -> Result<(), String> {
        if self.has_work() {
            return Err(format!(
                "not idle: {} queued, {} running",
                self.queue.len(),
                self.running.len()
            ));
        }
        if self.reserved != 0 {
            return Err(format!(
                "{} blocks still reserved while idle",
                self.reserved
            ));
        }
        if self.free_slots.len() != self.running_slots {
            return Err(format!(
                "{} of {} state slots free while idle",
                self.free_slots.len(),
                self.running_slots
            ));
        }
        self.pool.check_idle()
    }

    /// Ends every request with an error (engine shutting down).
    pub fn abort_all(&mut self, message: &str) {
        for p in self.queue.drain(..) {
            p.send(Event::Error {
                message: message.to_string(),
            });
        }
        while !self.running.is_empty() {
            let i = self.running.len() - 1;
            self.retire(i, Outcome::Failed(message.to_string()));
        }
    }

    /// One scheduling step: cancellations, admissions, one forward call, sampling.
    pub fn step(&mut self) {
        self.reap_cancelled();
        self.admit();
        if self.running.is_empty() {
            return;
        }
        let mut plan = self.plan();
        self.plan_speculation(&mut plan);
        let mut outcomes: Vec<Option<Outcome>> = (0..self.running.len()).map(|_| None).collect();

        // Hand out the blocks this step writes (from the sequences' reservations).
        let bs = self.cfg.block_size;
        plan.retain(|p| {
            let seq = &mut self.running[p.seq];
            let end = p.start + p.len;
            while seq.blocks.len() * bs < end {
                let block = if seq.reserved_left > 0 {
                    self.pool.alloc()
                } else {
                    None
                };
                let Some(block) = block else {
                    outcomes[p.seq] = Some(Outcome::Failed(
                        "internal error: KV block reservation exhausted".to_string(),
                    ));
                    return false;
                };
                seq.reserved_left -= 1;
                self.reserved -= 1;
                seq.blocks.push(block);
            }
            true
        });

        if !plan.is_empty() {
            self.draft(&mut plan);
            self.draft_prefill(&plan, &mut outcomes);
            plan.retain(|p| outcomes[p.seq].is_none());
            let backups = self.back_up_states(&plan);
            self.run_forward(&plan, &mut outcomes);
            self.restore_states(&plan, &backups, &mut outcomes);
        }
        for i in (0..outcomes.len()).rev() {
            if let Some(o) = outcomes[i].take() {
                self.retire(i, o);
            }
        }
    }

    /// Decodes first (one token for every decoding sequence), then prefill chunks in
    /// admission order while the step budget lasts.
    fn plan(&self) -> Vec<Planned> {
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.step_token_budget;
        let mut plan = Vec::with_capacity(self.running.len());
        for (i, s) in self.running.iter().enumerate() {
            if !s.in_prefill() && budget > 0 {
                plan.push(Planned {
                    seq: i,
                    start: s.computed,
                    len: 1,
                    want_logits: true,
                    prefill: false,
                    drafts: 0,
                });
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            if !s.in_prefill() || budget == 0 {
                continue;
            }
            let remaining = s.prompt_len - s.computed;
            let mut len = remaining.min(self.cfg.chunk_size).min(budget);
            if len < remaining {
                // A chunk that does not end the prompt ends on a block boundary, so chunk
                // boundaries are prefix-index boundaries (where a hybrid model's recurrent
                // state snapshot would be taken).
                let end = s.computed + len;
                let aligned = end - end % bs;
                if aligned > s.computed {
                    len = aligned - s.computed;
                }
            }
            budget -= len;
            plan.push(Planned {
                seq: i,
                start: s.computed,
                len,
                want_logits: len == remaining,
                prefill: true,
                drafts: 0,
            });
        }
        plan
    }

    /// The hot path: one `forward` over every planned sequence, then index and sample.
    fn run_forward(&mut self, plan: &[Planned], outcomes: &mut [Option<Outcome>]) {
        let bs = self.cfg.block_size;
        let hybrid = self.running_slots > 0;
        let steps: Vec<SeqStep<'_>> = plan
            .iter()
            .map(|p| {
                let s = &self.running[p.seq];
                let end = p.start + p.len;
                SeqStep {
                    tokens: &s.tokens[p.start..end],
                    start: p.start,
                    blocks: &s.blocks[..end.div_ceil(bs)],
                    want_logits: p.want_logits,
                    all_logits: p.drafts > 0,
                    slot: s.slot,
                    argmax_only: argmax_only(p, s, hybrid),
                }
            })
            .collect();
        let model = &mut self.model;
        let mut logits = std::mem::take(&mut self.logits);
        let t0 = Instant::now();
        let result = forward_guarded(model.as_mut(), &steps, &mut logits);
        let t1 = Instant::now();
        let argmax_asked: Vec<bool> = steps.iter().map(|s| s.argmax_only).collect();
        drop(steps);
        self.take_logits(plan, outcomes, result, &logits, &argmax_asked);
        self.logits = logits;
        self.counters.forward_ns += (t1 - t0).as_nanos() as u64;
        self.counters.sample_ns += t1.elapsed().as_nanos() as u64;
    }

    /// The step's bookkeeping and each sequence's use of its logits (or the step's failure).
    fn take_logits(
        &mut self,
        plan: &[Planned],
        outcomes: &mut [Option<Outcome>],
        result: Result<(), String>,
        step_logits: &Logits,
        argmax_asked: &[bool],
    ) {
        let logits = step_logits.rows();
        let bs = self.cfg.block_size;

        let c = &mut self.counters;
        c.forward_steps += 1;
        c.max_step_seqs = c.max_step_seqs.max(plan.len());
        let decodes = plan.iter().filter(|p| !p.prefill).count();
        c.max_step_decodes = c.max_step_decodes.max(decodes);
        c.computed_decode_tokens += plan
            .iter()
            .filter(|p| !p.prefill)
            .map(|p| p.len as u64)
            .sum::<u64>();
        c.computed_prompt_tokens += plan
            .iter()
            .filter(|p| p.prefill)
            .map(|p| p.len as u64)
            .sum::<u64>();

        let rows = |p: &Planned| match (p.want_logits, p.drafts) {
            (false, _) => 0,
            (true, 0) => 1,
            (true, _) => p.len,
        };
        let n_want: usize = plan.iter().map(rows).sum();
        let fail_all = |outcomes: &mut [Option<Outcome>], message: String| {
            for p in plan {
                outcomes[p.seq] = Some(Outcome::Failed(message.clone()));
            }
        };
        match result {
            Ok(()) if logits.len() == n_want * self.vocab => {}
            Ok(()) => {
                let message = format!(
                    "model error: forward returned {} logits, expected {n_want} x {}",
                    logits.len(),
                    self.vocab
                );
                return fail_all(outcomes, message);
            }
            Err(e) => return fail_all(outcomes, format!("model error: {e}")),
        }

        // the model's own argmax where it gave one (rows of argmax_only steps), then the
        // others sampled here
        let mut picks = vec![None; plan.len()];
        let mut k = 0;
        for (i, p) in plan.iter().enumerate() {
            if argmax_asked[i] {
                picks[i] = step_logits.pick(k);
            }
            k += rows(p);
        }
        self.sample_in_parallel(plan, logits, rows, &mut picks);
        let mut k = 0;
        for (i, p) in plan.iter().enumerate() {
            let logits = &logits[k * self.vocab..(k + rows(p)) * self.vocab];
            k += rows(p);
            if !p.prefill {
                self.running[p.seq].spec.decode_steps += 1;
            }
            if p.drafts > 0 {
                if let Some(reason) = self.verify(p, logits) {
                    outcomes[p.seq] = Some(Outcome::Finished(reason));
                }
            } else {
                self.running[p.seq].computed = p.start + p.len;
            }
            let seq = &mut self.running[p.seq];
            // Newly full blocks enter the prefix index at once.
            while seq.hashes.len() < seq.computed / bs {
                let i = seq.hashes.len();
                let parent = seq.hashes.last().copied().unwrap_or(ROOT_HASH);
                let h =
                    self.pool
                        .register(seq.blocks[i], parent, &seq.tokens[i * bs..(i + 1) * bs]);
                seq.hashes.push(h);
            }
            if p.prefill && self.running_slots > 0 {
                self.snapshot_after(p.seq, p.start + p.len, logits);
            }
            let seq = &mut self.running[p.seq];
            if p.want_logits && p.drafts == 0 {
                self.counters.generated_tokens += 1;
                let finished = match picks.get(i).copied().flatten() {
                    Some(id) => seq.emit(id, logits, &self.eog),
                    None => seq.on_logits(logits, &self.eog),
                };
                if let Some(reason) = finished {
                    outcomes[p.seq] = Some(Outcome::Finished(reason));
                }
            }
        }
    }

    /// With many sequences sampling in one step, each one's token drawn on its own thread
    /// (into `picks` by plan index, where it has none yet; `None`: left to the step loop,
    /// which samples in order). A 248k vocabulary is 1 MB of logits per sequence, read from
    /// memory the GPU just wrote: 32 of them one after another took longer than the GPU's
    /// whole step. Each sequence keeps its own sampler (and random state), so the picks are
    /// the same as in order.
    fn sample_in_parallel(
        &mut self,
        plan: &[Planned],
        logits: &[f32],
        rows: impl Fn(&Planned) -> usize,
        picks: &mut [Option<u32>],
    ) {
        const MIN_ROWS: usize = 4;
        let vocab = self.vocab;
        let to_sample =
            |i: usize, p: &Planned| p.want_logits && p.drafts == 0 && picks[i].is_none();
        let sampled = plan
            .iter()
            .enumerate()
            .filter(|&(i, p)| to_sample(i, p))
            .count();
        let threads = self.sample_threads.min(sampled / 2);
        if sampled < MIN_ROWS || threads < 2 {
            return;
        }
        // (plan index, the sequence's sampler and history, its logits row): disjoint borrows
        let mut by_seq: Vec<Option<&mut Sequence<'t>>> =
            self.running.iter_mut().map(Some).collect();
        let mut work = Vec::with_capacity(sampled);
        let mut k = 0;
        for (i, p) in plan.iter().enumerate() {
            if to_sample(i, p) {
                if let (Some(seq), Some(row)) = (
                    by_seq.get_mut(p.seq).and_then(Option::take),
                    logits.get(k * vocab..(k + 1) * vocab),
                ) {
                    work.push((i, &mut seq.sampler, &seq.tokens[..], row));
                }
            }
            k += rows(p);
        }
        let chunk = work.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .chunks_mut(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter_mut()
                            .map(|(i, sampler, history, row)| (*i, sampler.sample(row, history)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for h in handles {
                // a thread that panicked leaves its sequences to the step loop
                for (i, id) in h.join().unwrap_or_default() {
                    picks[i] = Some(id);
                }
            }
        });
    }

    /// Removes cancelled requests (queued or running). A running one keeps what it computed
    /// in the prefix index: full blocks were registered as they were finished.
    fn reap_cancelled(&mut self) {
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for p in self.queue.drain(..) {
            if p.is_cancelled() {
                self.counters.requests_cancelled += 1;
                p.send(Event::Done {
                    finish: FinishReason::Cancelled,
                    usage: crate::request::Usage {
                        prompt_tokens: p.req.prompt.len(),
                        ..Default::default()
                    },
                });
            } else {
                kept.push_back(p);
            }
        }
        self.queue = kept;
        for i in (0..self.running.len()).rev() {
            if self.running[i].is_cancelled() {
                self.retire(i, Outcome::Finished(FinishReason::Cancelled));
            }
        }
    }

    /// Takes sequence `i` out of the running set: releases its blocks and reservation, sends
    /// its last event.
    fn retire(&mut self, i: usize, outcome: Outcome) {
        let seq = self.running.remove(i);
        self.pool.release_all(&seq.blocks);
        if self.running_slots > 0 {
            self.free_slots.push(seq.slot);
        }
        self.reserved -= seq.reserved_left;
        match outcome {
            Outcome::Finished(finish) => {
                if finish == FinishReason::Cancelled {
                    self.counters.requests_cancelled += 1;
                } else {
                    self.counters.requests_finished += 1;
                }
                seq.send(Event::Done {
                    finish,
                    usage: seq.usage(Instant::now()),
                });
            }
            Outcome::Failed(message) => {
                self.counters.requests_failed += 1;
                seq.send(Event::Error { message });
            }
        }
    }
}
