//! A deterministic [`StepModel`] for tests (this crate's and front ends').
//!
//! Logits are a function of (position, last token): the token picked by a `next` function gets
//! a clear maximum, the rest a fixed pattern. The mock keeps the token written at every KV
//! position, so it can check that the engine only reads positions that were written, and it
//! records every step (including the full context each sequence saw) for assertions.
//!
//! With [`MockModel::with_device_argmax`] it plays a GPU that picks greedy rows itself: rows of
//! `argmax_only` steps come back as their argmax, their floats poisoned (a planted maximum on
//! another token), so an engine that read them would pick wrong.
//!
//! With [`MockModel::with_state_slots`] it plays a hybrid model: each state slot holds the
//! tokens it has consumed, a step starting at 0 clears its slot, and every other step fails
//! unless its slot holds exactly the context before `start` — so a resume from a wrong
//! snapshot, or a state not carried, is an error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::{SeqStep, StepModel};

/// Picks the most likely next token from (position of the last token, last token).
pub type NextToken = Arc<dyn Fn(usize, u32) -> u32 + Send + Sync>;

/// One sequence's share of a recorded step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedSeq {
    pub tokens: Vec<u32>,
    pub start: usize,
    pub blocks: Vec<u32>,
    pub want_logits: bool,
    pub argmax_only: bool,
    /// Tokens read back from the KV blocks for positions [0, start), then `tokens`.
    pub context: Vec<u32>,
}

/// Everything the mock saw.
#[derive(Debug, Clone, Default)]
pub struct MockLog {
    pub steps: Vec<Vec<RecordedSeq>>,
    /// `copy_block` calls: (src, dst, n_positions).
    pub copies: Vec<(u32, u32, usize)>,
    /// `copy_state` calls: (src, dst).
    pub state_copies: Vec<(u32, u32)>,
}

/// The mock model. See the module doc.
pub struct MockModel {
    vocab: usize,
    block_size: usize,
    /// Token at each position of each block (`None`: never written).
    kv: Vec<Vec<Option<u32>>>,
    next: NextToken,
    log: Arc<Mutex<MockLog>>,
    fail_on_token: Option<u32>,
    delay: Duration,
    /// Recurrent state per slot: the tokens consumed (`None`: never written).
    states: Vec<Option<Vec<u32>>>,
    /// Rows of `argmax_only` steps come back as picks (see the module doc).
    device_argmax: bool,
}

impl MockModel {
    pub fn new(
        vocab: usize,
        n_blocks: usize,
        block_size: usize,
        next: impl Fn(usize, u32) -> u32 + Send + Sync + 'static,
    ) -> Self {
        Self {
            vocab,
            block_size,
            kv: vec![vec![None; block_size]; n_blocks],
            next: Arc::new(next),
            log: Arc::new(Mutex::new(MockLog::default())),
            fail_on_token: None,
            delay: Duration::ZERO,
            states: Vec::new(),
            device_argmax: false,
        }
    }

    /// Gives the argmax of `argmax_only` rows as picks, their floats poisoned (module doc).
    pub fn with_device_argmax(mut self) -> Self {
        self.device_argmax = true;
        self
    }

    /// Plays a hybrid model with `n` recurrent-state slots (see the module doc).
    pub fn with_state_slots(mut self, n: usize) -> Self {
        self.states = vec![None; n];
        self
    }

    /// The shared log (keep a clone before boxing the model).
    pub fn log(&self) -> Arc<Mutex<MockLog>> {
        Arc::clone(&self.log)
    }

    /// `forward` fails whenever a step's new tokens contain `token`.
    pub fn fail_on_token(mut self, token: u32) -> Self {
        self.fail_on_token = Some(token);
        self
    }

    /// Sleeps this long in every `forward` (to make cancellation races observable).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Logits at `pos` after `last`: `next(pos, last)` gets 10, the rest a pattern in [0, 1.2].
    pub fn logits_at(&self, pos: usize, last: u32, out: &mut Vec<f32>) {
        let target = (self.next)(pos, last) as usize % self.vocab;
        for i in 0..self.vocab {
            let v = if i == target {
                10.0
            } else {
                ((pos * 31 + last as usize * 17 + i * 7) % 13) as f32 * 0.1
            };
            out.push(v);
        }
    }

    fn read(&self, blocks: &[u32], pos: usize) -> Result<u32, String> {
        let b = *blocks
            .get(pos / self.block_size)
            .ok_or_else(|| format!("no block for position {pos}"))?;
        let block = self
            .kv
            .get(b as usize)
            .ok_or_else(|| format!("block id {b} out of range"))?;
        block[pos % self.block_size]
            .ok_or_else(|| format!("position {pos} (block {b}) never written"))
    }
}

impl StepModel for MockModel {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn kv_blocks(&self) -> usize {
        self.kv.len()
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn forward(
        &mut self,
        seqs: &[SeqStep<'_>],
        out: &mut crate::model::Logits,
    ) -> Result<(), String> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if let Some(t) = self.fail_on_token {
            if seqs.iter().any(|s| s.tokens.contains(&t)) {
                return Err(format!("mock failure on token {t}"));
            }
        }
        let mut recorded = Vec::with_capacity(seqs.len());
        for s in seqs {
            if s.tokens.is_empty() {
                return Err("empty step".to_string());
            }
            let end = s.start + s.tokens.len();
            if s.blocks.len() * self.block_size < end {
                return Err(format!("block table too short for {end} positions"));
            }
            let mut context = (0..s.start)
                .map(|p| self.read(s.blocks, p))
                .collect::<Result<Vec<u32>, String>>()?;
            self.check_state(s, &context)?;
            context.extend_from_slice(s.tokens);
            recorded.push(RecordedSeq {
                tokens: s.tokens.to_vec(),
                start: s.start,
                blocks: s.blocks.to_vec(),
                want_logits: s.want_logits,
                argmax_only: s.argmax_only,
                context,
            });
        }
        let mut logits = Vec::new();
        let mut picks = Vec::new();
        for s in seqs {
            for (i, &t) in s.tokens.iter().enumerate() {
                let pos = s.start + i;
                let b = s.blocks[pos / self.block_size] as usize;
                self.kv[b][pos % self.block_size] = Some(t);
            }
            if let Some(state) = self.states.get_mut(s.slot as usize) {
                state
                    .get_or_insert_with(Vec::new)
                    .extend_from_slice(s.tokens);
            }
            if s.want_logits {
                let from = if s.all_logits { 0 } else { s.tokens.len() - 1 };
                for (i, &last) in s.tokens.iter().enumerate().skip(from) {
                    let row = logits.len();
                    self.logits_at(s.start + i, last, &mut logits);
                    let pick = (self.device_argmax && s.argmax_only && !s.all_logits)
                        .then(|| (self.next)(s.start + i, last) % self.vocab as u32);
                    if let Some(id) = pick {
                        let poison = (id as usize + 1) % self.vocab;
                        logits[row + poison] = 1e6;
                    }
                    picks.push(pick);
                }
            }
        }
        out.set_vec(logits)?;
        out.set_picks(picks);
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .steps
            .push(recorded);
        Ok(())
    }

    fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        if let (Some(from), true) = (
            self.kv.get(src as usize).cloned(),
            (dst as usize) < self.kv.len(),
        ) {
            let n = n_positions.min(self.block_size);
            self.kv[dst as usize][..n].copy_from_slice(&from[..n]);
        }
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .copies
            .push((src, dst, n_positions));
    }

    fn state_slots(&self) -> usize {
        self.states.len()
    }

    fn copy_state(&mut self, src: u32, dst: u32) {
        if let (Some(from), true) = (
            self.states.get(src as usize).cloned(),
            (dst as usize) < self.states.len(),
        ) {
            self.states[dst as usize] = from;
        }
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state_copies
            .push((src, dst));
    }
}

impl MockModel {
    /// A hybrid step's slot must hold exactly the context before `start` (cleared at 0).
    fn check_state(&mut self, s: &SeqStep<'_>, context: &[u32]) -> Result<(), String> {
        if self.states.is_empty() {
            return Ok(());
        }
        let n = self.states.len();
        let state = self
            .states
            .get_mut(s.slot as usize)
            .ok_or_else(|| format!("state slot {} of {n}", s.slot))?;
        if s.start == 0 {
            *state = Some(Vec::new());
        }
        match state {
            Some(held) if held[..] == context[..s.start] => Ok(()),
            Some(held) => Err(format!(
                "state slot {} holds {} positions that are not the context before {}",
                s.slot,
                held.len(),
                s.start
            )),
            None => Err(format!("state slot {} never written", s.slot)),
        }
    }
}
