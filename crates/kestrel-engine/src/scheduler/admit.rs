//! Admission: queued requests enter the running set in FIFO order when their blocks (less
//! what the prefix cache already holds) can be reserved; see the crate doc for why this cannot
//! deadlock. What a prompt takes from the prefix cache is `state.rs` (`reuse_kv`, and
//! `reuse_state` for hybrid models).

use super::{Scheduler, Sequence};
use crate::request::Event;
use crate::speculative::SpecState;
use crate::stop::StopMatcher;

impl Scheduler<'_> {
    /// Admits queued requests in FIFO order while a sequence slot is free and the head's
    /// blocks can be reserved (see the crate doc for why this cannot deadlock).
    pub(super) fn admit(&mut self) {
        let bs = self.cfg.block_size;
        let hybrid = self.running_slots > 0;
        while self.running.len() < self.cfg.max_running {
            let Some(front) = self.queue.front() else {
                break;
            };
            if hybrid && self.free_slots.is_empty() {
                break;
            }
            let plen = front.req.prompt.len();
            // (a draft model would still need the whole prompt's K/V: no whole-prompt reuse)
            let reuse = if hybrid {
                Self::reuse_state(&mut self.pool, &front.req.prompt, self.draft.is_none())
            } else {
                self.reuse_kv(&front.req.prompt)
            };
            let total = (plen + front.req.max_tokens).div_ceil(bs);
            let new_needed = total - reuse.shared.len();
            let mut leaving_lru = reuse
                .shared
                .iter()
                .filter(|&&b| self.pool.is_evictable(b))
                .count();
            if let Some((src, _)) = reuse.copy {
                leaving_lru += usize::from(self.pool.is_evictable(src));
            }
            if new_needed + leaving_lru + self.reserved > self.pool.available() {
                break;
            }
            let Some(p) = self.queue.pop_front() else {
                break;
            };

            for &b in &reuse.shared {
                self.pool.incref(b);
            }
            let slot = if hybrid { self.free_slots.pop() } else { None };
            if let (Some(from), Some(to)) = (reuse.state, slot) {
                self.model.copy_state(from, to);
            }
            let mut blocks = reuse.shared;
            let mut allocated = 0;
            let mut cached = blocks.len() * bs;
            if let Some((src, n)) = reuse.copy {
                self.pool.incref(src);
                let dst = self.pool.alloc();
                if let Some(dst) = dst {
                    if n > 0 {
                        self.model.copy_block(src, dst, n);
                        if let Some(draft) = self.draft.as_mut() {
                            draft.copy_block(src, dst, n);
                        }
                    }
                    blocks.push(dst);
                    allocated = 1;
                    cached += n;
                }
                self.pool.release(src);
            }
            if hybrid && cached != reuse.pos {
                // The tail block could not be had (the reservation check makes this
                // unreachable): the state would not match the blocks, so refuse.
                self.pool.release_all(&blocks);
                if let Some(slot) = slot {
                    self.free_slots.push(slot);
                }
                self.counters.requests_failed += 1;
                p.send(Event::Error {
                    message: "internal error: no KV block to resume the cached state".into(),
                });
                continue;
            }
            let reserved_left = new_needed - allocated;
            self.reserved += reserved_left;
            self.counters.prompt_tokens += plen as u64;
            self.counters.cached_prompt_tokens += cached as u64;

            let req = p.req;
            // The draft draws with the same chain and its own stream of random numbers.
            let draft_sampler = self
                .draft
                .as_ref()
                .map(|_| p.sampler.reseeded(p.sampler.seed() ^ 0x9e37_79b9_7f4a_7c15));
            self.running.push(Sequence {
                spec: SpecState::new(self.cfg.spec.k, cached, draft_sampler),
                tx: p.tx,
                cancel: p.cancel,
                submitted: p.submitted,
                first_token_at: None,
                prompt_len: plen,
                cached_tokens: cached,
                computed: cached,
                blocks,
                hashes: reuse.hashes,
                reserved_left,
                slot: slot.unwrap_or(0),
                snapshots: Default::default(),
                max_tokens: req.max_tokens,
                ignore_eos: req.ignore_eos,
                logprobs: req.logprobs,
                sampler: p.sampler,
                decoder: self.tokenizer.stream_decoder(true),
                stop: StopMatcher::new(&req.stop),
                tokens: req.prompt,
            });
            if let Some(logits) = reuse.logits {
                // the whole prompt was cached: its first token comes from the kept logits
                let i = self.running.len() - 1;
                self.counters.generated_tokens += 1;
                if let Some(finish) = self.running[i].on_logits(&logits, &self.eog) {
                    self.retire(i, super::Outcome::Finished(finish));
                }
            }
        }
    }
}
