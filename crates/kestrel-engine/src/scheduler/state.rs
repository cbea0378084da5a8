//! What an admitted prompt reuses of the prefix cache, and (hybrid models, Qwen3.5) the
//! recurrent-state snapshots a prefill leaves behind.
//!
//! Every running sequence owns a state slot (`Sequence::slot`). After each prefill chunk the
//! scheduler snapshots that slot into the block pool's snapshot slots:
//! - at a chunk boundary inside the prompt (always block-aligned, see `plan`), attached to the
//!   index entry of the block that ends there; a sequence keeps its latest
//!   `SNAPSHOTS_PER_SEQUENCE - 1` of these (older ones are dropped as newer ones come);
//! - at the end of the prompt, attached to the last block when the prompt ends on a block
//!   boundary, else to a tail entry (the partial block's positions copied into a block of the
//!   entry's own), so the next turn of a conversation, which extends this prompt, resumes
//!   exactly there.
//!
//! A new prompt resumes from the longest cached prefix that ends at a snapshot: its full
//! blocks are shared, a tail's positions copied into the sequence's own block, and the
//! snapshot copied into its slot; `cached_tokens` is that position. An end-of-prompt snapshot
//! also keeps that prompt's last logits: the same prompt asked again (a retry, a regenerated
//! answer) resumes after its last token and samples its first token from them, computing
//! nothing (without them it could reuse nothing: the state before the last token is not kept).

use super::{Reuse, Scheduler};
use crate::blocks::{chain_hash, BlockPool, ROOT_HASH};
use crate::paged::SNAPSHOTS_PER_SEQUENCE;

impl Scheduler<'_> {
    /// What a prompt reuses of the prefix cache (models without recurrent state): its longest
    /// cached prefix of full blocks. The last prompt token must run (its logits start
    /// generation): a prompt cached whole keeps all but its last block shared and copies that
    /// block's first block_size - 1 positions into a private block.
    pub(super) fn reuse_kv(&self, prompt: &[u32]) -> Reuse {
        let bs = self.cfg.block_size;
        let plen = prompt.len();
        let m = self.pool.lookup(&prompt[..plen / bs * bs]);
        let cow = !m.blocks.is_empty() && m.blocks.len() * bs == plen;
        let keep = if cow {
            m.blocks.len() - 1
        } else {
            m.blocks.len()
        };
        Reuse {
            shared: m.blocks[..keep].to_vec(),
            hashes: m.hashes[..keep].to_vec(),
            copy: cow.then(|| (m.blocks[keep], bs - 1)),
            state: None,
            pos: if cow { plen - 1 } else { keep * bs },
            logits: None,
        }
    }

    /// What a hybrid prompt reuses: with `whole`, the whole prompt where its end-of-prompt
    /// snapshot kept the last logits (it resumes after its last token); else the longest
    /// cached prefix that ends at a snapshot, short of the last prompt token (which must run
    /// for its logits).
    pub(super) fn reuse_state(pool: &mut BlockPool, prompt: &[u32], whole: bool) -> Reuse {
        let whole = whole
            .then(|| pool.lookup_resume(prompt))
            .flatten()
            .and_then(|r| {
                let logits = pool.prompt_logits(r.slot)?.to_vec();
                (r.pos == prompt.len()).then_some((r, logits))
            });
        let (r, logits) = match whole {
            Some((r, logits)) => (Some(r), Some(logits)),
            None => (pool.lookup_resume(&prompt[..prompt.len() - 1]), None),
        };
        match r {
            Some(r) => Reuse {
                shared: r.blocks,
                hashes: r.hashes,
                copy: r.tail,
                state: Some(r.slot),
                pos: r.pos,
                logits,
            },
            None => Reuse {
                shared: Vec::new(),
                hashes: Vec::new(),
                copy: None,
                state: None,
                pos: 0,
                logits: None,
            },
        }
    }

    /// Snapshots sequence `i`'s state after a prefill chunk that ended at position `end`;
    /// at the prompt's end with `logits`, its last position's.
    pub(super) fn snapshot_after(&mut self, i: usize, end: usize, logits: &[f32]) {
        let bs = self.cfg.block_size;
        let seq = &self.running[i];
        let work = seq.slot;
        if end < seq.prompt_len {
            let keep = SNAPSHOTS_PER_SEQUENCE.saturating_sub(1);
            if !end.is_multiple_of(bs) || keep == 0 {
                return;
            }
            let hash = seq.hashes[end / bs - 1];
            if let Some(slot) = self.pool.attach_snapshot(hash) {
                self.model.copy_state(work, slot);
                self.counters.snapshots_taken += 1;
                let seq = &mut self.running[i];
                seq.snapshots.push_back(hash);
                while seq.snapshots.len() > keep {
                    if let Some(old) = seq.snapshots.pop_front() {
                        self.pool.drop_snapshot(old);
                    }
                }
            }
        } else if end.is_multiple_of(bs) {
            let hash = seq.hashes[end / bs - 1];
            if let Some(slot) = self.pool.attach_snapshot(hash) {
                self.model.copy_state(work, slot);
                self.counters.snapshots_taken += 1;
            }
            if !logits.is_empty() {
                self.pool.keep_prompt_logits(hash, logits);
            }
        } else {
            let d = end / bs;
            let parent = if d == 0 { ROOT_HASH } else { seq.hashes[d - 1] };
            let src = seq.blocks[d];
            let tokens = &seq.tokens[d * bs..end];
            let hash = chain_hash(parent, tokens);
            let tail = self.pool.add_tail(parent, tokens);
            if let Some((block, slot)) = tail {
                self.model.copy_block(src, block, end - d * bs);
                self.model.copy_state(work, slot);
                self.counters.snapshots_taken += 1;
            }
            if !logits.is_empty() {
                self.pool.keep_prompt_logits(hash, logits);
            }
        }
    }
}
