//! KV block bookkeeping: reference counts, free list, prefix index, LRU eviction.
//!
//! Pure bookkeeping over block ids `0..n_blocks`; the model stores the data. A block is in
//! exactly one of three states:
//!
//! - **used**: referenced by one or more sequences (`refcount > 0`), indexed or not;
//! - **cached**: unreferenced but in the prefix index, so a later request can take it; these are
//!   evicted least-recently-used when the pool needs a block;
//! - **free**: unreferenced and not indexed.
//!
//! The prefix index maps a chain hash to a block. The chain hash of block `i` of a sequence is
//! `hash(chain hash of block i-1, tokens of block i)` (a fixed root for block 0), so one hash
//! names a whole prefix and a lookup walks the prompt block by block: the longest cached prefix
//! over every cached sequence, found in `prompt / block_size` map lookups. Each entry keeps its
//! parent hash and tokens, and a lookup compares them, so a hash collision can only cost a miss.
//!
//! Hybrid models (recurrent state) add snapshots to the index (`snapshots.rs`): an entry may
//! carry the state slot that holds the state after its last token, and a *tail* entry keeps
//! the K/V of a prompt's partial last block (fewer than `block_size` tokens) in a block of its
//! own, together with the state at that exact position.

mod snapshots;

use snapshots::SnapshotSlots;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Chain hash of the empty prefix (the parent of every sequence's first block).
pub const ROOT_HASH: u64 = 0x6b65_7374_7265_6c00;

/// Chain hash of a block: its parent's chain hash and its tokens.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: deterministic across runs and processes.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// A prefix-index entry.
#[derive(Debug, Clone)]
struct CachedBlock {
    hash: u64,
    parent: u64,
    /// `block_size` tokens, or fewer for a tail entry.
    tokens: Box<[u32]>,
    /// State slot holding the recurrent state after the last of `tokens` (hybrid models; a
    /// tail entry always has one).
    snapshot: Option<u32>,
}

/// The longest cached prefix of a prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Matched blocks, in sequence order (block i covers prompt positions of block i).
    pub blocks: Vec<u32>,
    /// Their chain hashes.
    pub hashes: Vec<u64>,
}

/// Reference-counted block pool with a prefix index over full blocks.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    refcount: Vec<u32>,
    /// Index entry of each block, if it is in the prefix index.
    entry: Vec<Option<CachedBlock>>,
    /// Chain hash -> block.
    index: HashMap<u64, u32>,
    /// Unreferenced, unindexed blocks (a stack).
    free: Vec<u32>,
    /// Unreferenced indexed blocks by last-use tick: the first is evicted first.
    lru: BTreeMap<u64, u32>,
    /// Tick under which a block sits in `lru`.
    lru_tick: Vec<u64>,
    tick: u64,
    /// Snapshot slots of hybrid models (none otherwise).
    snaps: SnapshotSlots,
    /// Parent hash -> number of tail entries under it (so lookups probe tails only there).
    tail_parents: HashMap<u64, u32>,
}

impl BlockPool {
    pub fn new(n_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            refcount: vec![0; n_blocks],
            entry: vec![None; n_blocks],
            index: HashMap::new(),
            // Reversed so blocks are handed out 0, 1, 2, ...
            free: (0..n_blocks as u32).rev().collect(),
            lru: BTreeMap::new(),
            lru_tick: vec![0; n_blocks],
            tick: 0,
            snaps: SnapshotSlots::new(0, 0),
            tail_parents: HashMap::new(),
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.refcount.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that can be handed out now: free plus cached (evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn cached_count(&self) -> usize {
        self.lru.len()
    }

    pub fn used_count(&self) -> usize {
        self.refcount.iter().filter(|&&r| r > 0).count()
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.refcount.get(block as usize).copied().unwrap_or(0)
    }

    /// Whether the block is unreferenced and cached, i.e. taking a reference removes it from
    /// the evictable set.
    pub fn is_evictable(&self, block: u32) -> bool {
        self.refcount(block) == 0 && self.is_indexed(block)
    }

    pub fn is_indexed(&self, block: u32) -> bool {
        matches!(self.entry.get(block as usize), Some(Some(_)))
    }

    /// Hands out one block with refcount 1: a free one, else the least recently used cached
    /// one (which leaves the index). `None` when every block is referenced.
    pub fn alloc(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                self.unindex(b);
                b
            }
        };
        self.refcount[block as usize] = 1;
        Some(block)
    }

    /// Takes one more reference on a block (a cached one leaves the evictable set).
    pub fn incref(&mut self, block: u32) {
        let i = block as usize;
        if self.refcount[i] == 0 && self.entry[i].is_some() {
            self.lru.remove(&self.lru_tick[i]);
        }
        self.refcount[i] += 1;
    }

    /// Drops one reference; an unreferenced block becomes cached (if indexed, as the most
    /// recently used) or free.
    pub fn release(&mut self, block: u32) {
        let i = block as usize;
        debug_assert!(
            self.refcount[i] > 0,
            "release of unreferenced block {block}"
        );
        if self.refcount[i] == 0 {
            return;
        }
        self.refcount[i] -= 1;
        if self.refcount[i] == 0 {
            if self.entry[i].is_some() {
                self.tick += 1;
                self.lru_tick[i] = self.tick;
                self.lru.insert(self.tick, block);
            } else {
                self.free.push(block);
            }
        }
    }

    /// Releases a sequence's block table, last block first, so that under pressure a
    /// sequence's tail is evicted before its prefix (which more requests share).
    pub fn release_all(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            self.release(b);
        }
    }

    /// Enters a full block into the prefix index under `chain_hash(parent, tokens)` and returns
    /// that hash. If another block already holds this prefix, the index keeps that one.
    pub fn register(&mut self, block: u32, parent: u64, tokens: &[u32]) -> u64 {
        let hash = chain_hash(parent, tokens);
        let i = block as usize;
        if self.entry[i].is_some() || self.index.contains_key(&hash) {
            return hash;
        }
        self.index.insert(hash, block);
        self.entry[i] = Some(CachedBlock {
            hash,
            parent,
            tokens: tokens.into(),
            snapshot: None,
        });
        if self.refcount[i] == 0 {
            // Registering an unreferenced block (not done by the scheduler): it becomes cached.
            if let Some(pos) = self.free.iter().position(|&b| b == block) {
                self.free.swap_remove(pos);
            }
            self.tick += 1;
            self.lru_tick[i] = self.tick;
            self.lru.insert(self.tick, block);
        }
        hash
    }

    /// The longest cached prefix of `tokens`, over full blocks only. Takes no references.
    pub fn lookup(&self, tokens: &[u32]) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size) {
            let hash = chain_hash(parent, chunk);
            let Some(&block) = self.index.get(&hash) else {
                break;
            };
            match &self.entry[block as usize] {
                Some(e) if e.parent == parent && *e.tokens == *chunk => {}
                _ => break,
            }
            m.blocks.push(block);
            m.hashes.push(hash);
            parent = hash;
        }
        m
    }

    /// Takes a block out of the index; a snapshot it carried goes back to the free slots (a
    /// snapshot without its blocks is useless).
    fn unindex(&mut self, block: u32) {
        if let Some(e) = self.entry[block as usize].take() {
            if self.index.get(&e.hash) == Some(&block) {
                self.index.remove(&e.hash);
            }
            if let Some(slot) = e.snapshot {
                self.snaps.release(slot);
            }
            if e.tokens.len() < self.block_size {
                if let Some(n) = self.tail_parents.get_mut(&e.parent) {
                    *n -= 1;
                    if *n == 0 {
                        self.tail_parents.remove(&e.parent);
                    }
                }
            }
        }
    }

    /// When no sequence holds a block: every block is free or cached, none referenced, and
    /// the free list, LRU and index agree.
    pub fn check_idle(&self) -> Result<(), String> {
        let n = self.n_blocks();
        let referenced: Vec<usize> = (0..n).filter(|&i| self.refcount[i] != 0).collect();
        if !referenced.is_empty() {
            return Err(format!(
                "{} blocks still referenced while idle (first: {:?})",
                referenced.len(),
                &referenced[..referenced.len().min(8)]
            ));
        }
        if self.free.len() + self.lru.len() != n {
            return Err(format!(
                "free ({}) + cached ({}) != pool size ({n}): blocks leaked",
                self.free.len(),
                self.lru.len()
            ));
        }
        let mut seen = vec![false; n];
        for &b in &self.free {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("block {b} twice in free/cached lists"));
            }
            if self.entry[b as usize].is_some() {
                return Err(format!("free block {b} is still indexed"));
            }
        }
        for (&t, &b) in &self.lru {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("block {b} twice in free/cached lists"));
            }
            if self.entry[b as usize].is_none() || self.lru_tick[b as usize] != t {
                return Err(format!(
                    "cached block {b} has no index entry or a stale tick"
                ));
            }
        }
        for (&h, &b) in &self.index {
            match &self.entry[b as usize] {
                Some(e) if e.hash == h => {}
                _ => return Err(format!("index entry {h:#x} -> block {b} is stale")),
            }
        }
        self.check_snapshots()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_register_lookup() {
        let mut p = BlockPool::new(4, 2);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        let h0 = p.register(a, ROOT_HASH, &[1, 2]);
        p.register(b, h0, &[3, 4]);
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5]).blocks, vec![a, b]);
        assert_eq!(p.lookup(&[1, 2, 9, 9]).blocks, vec![a]);
        assert!(p.lookup(&[2, 2]).blocks.is_empty());
        p.release_all(&[a, b]);
        assert_eq!(
            (p.free_count(), p.cached_count(), p.used_count()),
            (2, 2, 0)
        );
        p.check_idle().unwrap();
        // Pressure: free blocks go first, then the LRU tail (b before a).
        let c = p.alloc().unwrap();
        let d = p.alloc().unwrap();
        let e = p.alloc().unwrap();
        assert_eq!(e, b);
        assert_eq!(p.lookup(&[1, 2, 3, 4]).blocks, vec![a]);
        p.release_all(&[c, d, e]);
        p.check_idle().unwrap();
    }

    #[test]
    fn incref_takes_block_out_of_lru() {
        let mut p = BlockPool::new(1, 2);
        let a = p.alloc().unwrap();
        p.register(a, ROOT_HASH, &[7, 7]);
        p.release(a);
        assert_eq!(p.available(), 1);
        p.incref(a);
        assert_eq!(p.available(), 0);
        assert!(p.alloc().is_none());
        p.release(a);
        p.check_idle().unwrap();
    }
}
