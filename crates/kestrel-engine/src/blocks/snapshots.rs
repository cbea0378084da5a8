//! Recurrent-state snapshots in the prefix index (hybrid models).
//!
//! A snapshot is a state slot of the model holding the state after some prefix. It hangs off
//! the index entry that ends that prefix: a full block (a prefill chunk ended there, or a
//! prompt ended on a block boundary), or a *tail* entry — a prompt that ended inside a block:
//! its first `n < block_size` positions are copied into a block the entry owns, keyed by
//! `chain_hash(parent, those n tokens)`. A tail block is unreferenced and sits in the LRU like
//! any cached block.
//!
//! Consistency: a snapshot lives exactly as long as its entry. Evicting a block frees the
//! snapshot it carries (`unindex`); evicting a snapshot (the pool is full: least recently used
//! first) detaches it from its full block, or frees its tail entry and block together. The pool
//! is bounded (the slots handed over by [`BlockPool::with_snapshots`]); the per-sequence bound is
//! the scheduler's.
//!
//! A hybrid prompt resumes at the longest cached prefix that ends at a snapshot
//! ([`BlockPool::lookup_resume`]).

use std::collections::BTreeMap;

use super::{chain_hash, BlockPool, CachedBlock, ROOT_HASH};

/// The snapshot slots: which entry owns each, a free list, and least-recently-used order.
#[derive(Debug)]
pub(super) struct SnapshotSlots {
    /// Model slot id of the first snapshot slot.
    base: u32,
    /// Per slot: the chain hash of the entry it is attached to.
    owner: Vec<Option<u64>>,
    free: Vec<u32>,
    lru: BTreeMap<u64, u32>,
    tick_of: Vec<u64>,
    tick: u64,
    pub evicted: u64,
    /// Per slot: the logits of the prompt's last position, where the snapshot is a prompt's
    /// end (a prompt asked again then starts generating from them with nothing to compute).
    logits: Vec<Option<Box<[f32]>>>,
}

impl SnapshotSlots {
    pub fn new(base: u32, n: usize) -> Self {
        Self {
            base,
            owner: vec![None; n],
            free: (0..n as u32).rev().map(|i| base + i).collect(),
            lru: BTreeMap::new(),
            tick_of: vec![0; n],
            tick: 0,
            evicted: 0,
            logits: vec![None; n],
        }
    }

    fn idx(&self, slot: u32) -> usize {
        (slot - self.base) as usize
    }

    /// Returns a slot to the free list.
    pub fn release(&mut self, slot: u32) {
        let i = self.idx(slot);
        if self.owner[i].take().is_some() {
            self.lru.remove(&self.tick_of[i]);
            self.logits[i] = None;
            self.free.push(slot);
        }
    }

    /// Marks a slot as just used.
    pub fn touch(&mut self, slot: u32) {
        let i = self.idx(slot);
        if self.owner[i].is_some() {
            self.lru.remove(&self.tick_of[i]);
            self.tick += 1;
            self.tick_of[i] = self.tick;
            self.lru.insert(self.tick, slot);
        }
    }

    fn attach(&mut self, slot: u32, owner: u64) {
        let i = self.idx(slot);
        self.owner[i] = Some(owner);
        self.tick += 1;
        self.tick_of[i] = self.tick;
        self.lru.insert(self.tick, slot);
    }
}

/// Where a hybrid prompt resumes: the shared full blocks, and the snapshot after them (and
/// after the tail's positions, if the snapshot is a tail's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// Full blocks of the prefix, in order.
    pub blocks: Vec<u32>,
    pub hashes: Vec<u64>,
    /// A tail entry: its block and the positions it holds (copied into the sequence's own
    /// block, which it then continues).
    pub tail: Option<(u32, usize)>,
    /// The state slot to resume from.
    pub slot: u32,
    /// Positions reused: `blocks.len() * block_size` + the tail's positions.
    pub pos: usize,
}

impl BlockPool {
    /// Hands model state slots `first..first + n` to the snapshot pool.
    pub fn with_snapshots(mut self, first: u32, n: usize) -> Self {
        self.snaps = SnapshotSlots::new(first, n);
        self
    }

    /// Size of the snapshot pool.
    pub fn snapshot_slots(&self) -> usize {
        self.snaps.owner.len()
    }

    /// Snapshots held now.
    pub fn snapshots_used(&self) -> usize {
        self.snapshot_slots() - self.snaps.free.len()
    }

    /// Snapshots evicted to make room for newer ones, since start.
    pub fn snapshots_evicted(&self) -> u64 {
        self.snaps.evicted
    }

    /// A free slot, evicting the least recently used snapshot when none is free.
    fn grant_slot(&mut self) -> Option<u32> {
        if self.snaps.free.is_empty() {
            // Out of the LRU first; `release` (through `detach`) then finds its tick gone.
            let (_, victim) = self.snaps.lru.pop_first()?;
            let owner = self.snaps.owner[self.snaps.idx(victim)];
            match owner.and_then(|h| self.index.get(&h).copied()) {
                Some(block) => self.detach(block),
                None => self.snaps.release(victim),
            }
            self.snaps.evicted += 1;
        }
        self.snaps.free.pop()
    }

    /// Frees the snapshot of an indexed block; a tail entry goes with it, and its block
    /// becomes free.
    fn detach(&mut self, block: u32) {
        let i = block as usize;
        let Some(e) = self.entry[i].as_mut() else {
            return;
        };
        let Some(slot) = e.snapshot.take() else {
            return;
        };
        self.snaps.release(slot);
        if e.tokens.len() < self.block_size {
            self.unindex(block);
            if self.refcount[i] == 0 {
                self.lru.remove(&self.lru_tick[i]);
                self.free.push(block);
            }
        }
    }

    /// A snapshot for the indexed full block `hash`: the slot to copy the state into, or
    /// `None` when the entry already has one (then marked used), is not indexed, or the pool
    /// has no slots.
    pub fn attach_snapshot(&mut self, hash: u64) -> Option<u32> {
        let &block = self.index.get(&hash)?;
        if let Some(slot) = self.entry[block as usize].as_ref()?.snapshot {
            self.snaps.touch(slot);
            return None;
        }
        let slot = self.grant_slot()?;
        // The eviction may have taken this very entry's block out of the index.
        let Some(e) = self.entry[block as usize]
            .as_mut()
            .filter(|e| e.hash == hash)
        else {
            self.snaps.free.push(slot);
            return None;
        };
        e.snapshot = Some(slot);
        self.snaps.attach(slot, hash);
        Some(slot)
    }

    /// A tail snapshot: the state after `tokens` (fewer than `block_size`) following the
    /// prefix `parent`. Returns the block to copy those positions' K/V into and the slot to
    /// copy the state into; `None` when such an entry exists already (then marked used) or no
    /// slot or block can be had.
    pub fn add_tail(&mut self, parent: u64, tokens: &[u32]) -> Option<(u32, u32)> {
        if tokens.is_empty() || tokens.len() >= self.block_size {
            return None;
        }
        let hash = chain_hash(parent, tokens);
        if let Some(&b) = self.index.get(&hash) {
            if let Some(slot) = self.entry[b as usize].as_ref().and_then(|e| e.snapshot) {
                self.snaps.touch(slot);
            }
            return None;
        }
        let slot = self.grant_slot()?;
        let Some(block) = self.alloc() else {
            self.snaps.free.push(slot);
            return None;
        };
        self.index.insert(hash, block);
        self.entry[block as usize] = Some(CachedBlock {
            hash,
            parent,
            tokens: tokens.into(),
            snapshot: Some(slot),
        });
        *self.tail_parents.entry(parent).or_insert(0) += 1;
        self.snaps.attach(slot, hash);
        self.release(block); // unreferenced and indexed: cached
        Some((block, slot))
    }

    /// Keeps `logits` (the last position's, of a prompt that ends at entry `hash`) with that
    /// entry's snapshot, if it has one.
    pub fn keep_prompt_logits(&mut self, hash: u64, logits: &[f32]) {
        let Some(&block) = self.index.get(&hash) else {
            return;
        };
        if let Some(slot) = self.entry[block as usize].as_ref().and_then(|e| e.snapshot) {
            let i = self.snaps.idx(slot);
            self.snaps.logits[i] = Some(logits.into());
        }
    }

    /// The logits kept with snapshot `slot` ([`Self::keep_prompt_logits`]).
    pub fn prompt_logits(&self, slot: u32) -> Option<&[f32]> {
        let i = slot.checked_sub(self.snaps.base)? as usize;
        self.snaps.logits.get(i)?.as_deref()
    }

    /// Frees the snapshot of entry `hash`, if it has one (the per-sequence bound).
    pub fn drop_snapshot(&mut self, hash: u64) {
        if let Some(&block) = self.index.get(&hash) {
            self.detach(block);
        }
    }

    /// The longest cached prefix of `tokens` that ends at a snapshot (takes no references;
    /// marks the snapshot used).
    pub fn lookup_resume(&mut self, tokens: &[u32]) -> Option<Resume> {
        let bs = self.block_size;
        let m = self.lookup(tokens);
        for d in (0..=m.blocks.len()).rev() {
            let parent = if d == 0 { ROOT_HASH } else { m.hashes[d - 1] };
            let rest = &tokens[d * bs..];
            if self.tail_parents.contains_key(&parent) {
                for n in (1..bs.min(rest.len() + 1)).rev() {
                    let Some(&b) = self.index.get(&chain_hash(parent, &rest[..n])) else {
                        continue;
                    };
                    let Some(e) = &self.entry[b as usize] else {
                        continue;
                    };
                    if let (true, Some(slot)) =
                        (e.parent == parent && *e.tokens == rest[..n], e.snapshot)
                    {
                        self.snaps.touch(slot);
                        return Some(Resume {
                            blocks: m.blocks[..d].to_vec(),
                            hashes: m.hashes[..d].to_vec(),
                            tail: Some((b, n)),
                            slot,
                            pos: d * bs + n,
                        });
                    }
                }
            }
            if d == 0 {
                break;
            }
            let snapshot = self.entry[m.blocks[d - 1] as usize]
                .as_ref()
                .and_then(|e| e.snapshot);
            if let Some(slot) = snapshot {
                self.snaps.touch(slot);
                return Some(Resume {
                    blocks: m.blocks[..d].to_vec(),
                    hashes: m.hashes[..d].to_vec(),
                    tail: None,
                    slot,
                    pos: d * bs,
                });
            }
        }
        None
    }

    /// Every snapshot slot is free or owned by exactly one indexed entry that names it; every
    /// tail entry has a snapshot; the tail counts agree.
    pub(super) fn check_snapshots(&self) -> Result<(), String> {
        let s = &self.snaps;
        if s.free.len() + s.lru.len() != s.owner.len() {
            return Err(format!(
                "snapshot slots: free ({}) + held ({}) != pool ({})",
                s.free.len(),
                s.lru.len(),
                s.owner.len()
            ));
        }
        let mut tails = std::collections::HashMap::new();
        for (b, e) in self.entry.iter().enumerate() {
            let Some(e) = e else { continue };
            if e.tokens.len() < self.block_size {
                if e.snapshot.is_none() {
                    return Err(format!("tail block {b} has no snapshot"));
                }
                *tails.entry(e.parent).or_insert(0u32) += 1;
            }
            if let Some(slot) = e.snapshot {
                if s.owner.get(s.idx(slot)).copied().flatten() != Some(e.hash) {
                    return Err(format!(
                        "block {b}'s snapshot slot {slot} names another owner"
                    ));
                }
            }
        }
        if tails != self.tail_parents {
            return Err("tail entry counts disagree with the index".to_string());
        }
        for (i, owner) in s.owner.iter().enumerate() {
            let Some(h) = owner else { continue };
            let slot = s.base + i as u32;
            let named = self
                .index
                .get(h)
                .and_then(|&b| self.entry[b as usize].as_ref());
            if named.and_then(|e| e.snapshot) != Some(slot) {
                return Err(format!("snapshot slot {slot} is held by no index entry"));
            }
        }
        Ok(())
    }
}
