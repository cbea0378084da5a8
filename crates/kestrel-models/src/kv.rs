//! KV storage as the model sees it: a pool of fixed-size blocks shared by all sequences.
//!
//! A layer's keys live in one array laid out `[n_blocks][n_kv_heads][block_size][head_dim]`
//! (values alike): within a block each kv head's positions are contiguous, so attention, which
//! works one kv head per task, streams one dense run per block instead of a strided slice of
//! every row. A sequence owns a block table; its position `p` lives in pool row
//! `blocks[p / block_size] * block_size + p % block_size` ([`KvPool::offset`] places a row's head). Recipes reach K/V only through
//! [`KvPool`] (write rows, read rows) and a sequence's [`SeqKv`] view (its table and length).
//! [`KvCache`] is the one-sequence case (`run`, `chat`, `logits`): a pool whose table is the
//! identity.

use crate::deltanet::StatePool;
use half::f16;

/// Element type of cached K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    /// 8-bit blocks of 32 with an f16 scale (34 bytes per 32 values): about half of f16.
    /// Needs head_dim to be a multiple of 32 so every head is whole blocks.
    Q8_0,
}

impl KvType {
    /// Bytes per element (fractional for q8_0).
    pub fn bytes_per_elem(self) -> f64 {
        match self {
            KvType::F32 => 4.0,
            KvType::F16 => 2.0,
            KvType::Q8_0 => 34.0 / 32.0,
        }
    }

    /// Bytes of `n` elements (`n` a multiple of 32 for q8_0).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n / 32 * 34,
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }
}

enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Q8_0 blocks; element offsets are multiples of 32, so `at / 32 * 34` is the byte offset.
    Q8_0(Vec<u8>),
}

const Q8_BLOCK: usize = 32;
const Q8_BYTES: usize = 34;

impl Store {
    fn new(ty: KvType, len: usize) -> Self {
        match ty {
            KvType::F32 => Store::F32(vec![0.0; len]),
            KvType::F16 => Store::F16(vec![f16::ZERO; len]),
            KvType::Q8_0 => Store::Q8_0(vec![0; len / Q8_BLOCK * Q8_BYTES]),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::Q8_0(v) => {
                let b = at / Q8_BLOCK * Q8_BYTES;
                let n = src.len() / Q8_BLOCK * Q8_BYTES;
                // Lengths are whole blocks by construction (checked when the pool is made).
                let _ = kestrel_quant::quantize_activation_row(
                    kestrel_gguf::GgmlType::Q8_0,
                    src,
                    &mut v[b..b + n],
                );
            }
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Store::F16(v) => {
                for (d, s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(*s);
                }
            }
        }
    }

    fn read(&self, at: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            Store::Q8_0(v) => {
                let b = at / Q8_BLOCK * Q8_BYTES;
                let bytes = n / Q8_BLOCK * Q8_BYTES;
                let _ = kestrel_quant::dequantize_row(
                    kestrel_gguf::GgmlType::Q8_0,
                    &v[b..b + bytes],
                    out,
                );
            }
            Store::F32(v) => out.copy_from_slice(&v[at..at + n]),
            Store::F16(v) => {
                for (d, s) in out.iter_mut().zip(&v[at..at + n]) {
                    *d = s.to_f32();
                }
            }
        }
    }

    fn copy_within(&mut self, src: usize, dst: usize, len: usize) {
        match self {
            Store::Q8_0(v) => {
                let (s, d, n) = (
                    src / Q8_BLOCK * Q8_BYTES,
                    dst / Q8_BLOCK * Q8_BYTES,
                    len / Q8_BLOCK * Q8_BYTES,
                );
                v.copy_within(s..s + n, d)
            }
            Store::F32(v) => v.copy_within(src..src + len, dst),
            Store::F16(v) => v.copy_within(src..src + len, dst),
        }
    }
}

/// K and V of every layer for `n_blocks` blocks of `block_size` positions.
pub struct KvPool {
    k: Vec<Store>,
    v: Vec<Store>,
    kv_dim: usize,
    head_dim: usize,
    block_size: usize,
    n_blocks: usize,
    ty: KvType,
}

impl KvPool {
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        n_blocks: usize,
        block_size: usize,
        ty: KvType,
    ) -> Self {
        let kv_dim = n_kv_heads * head_dim;
        let rows = n_blocks * block_size;
        Self {
            k: (0..n_layers)
                .map(|_| Store::new(ty, rows * kv_dim))
                .collect(),
            v: (0..n_layers)
                .map(|_| Store::new(ty, rows * kv_dim))
                .collect(),
            kv_dim,
            head_dim,
            block_size,
            n_blocks,
            ty,
        }
    }

    /// Bytes one block takes across all layers (K and V).
    pub fn block_bytes(n_layers: usize, kv_dim: usize, block_size: usize, ty: KvType) -> usize {
        2 * n_layers * ty.bytes_for(kv_dim) * block_size
    }

    /// Whether a model with this head size can store its K/V as `ty`.
    pub fn supports(ty: KvType, head_dim: usize) -> bool {
        ty != KvType::Q8_0 || head_dim.is_multiple_of(Q8_BLOCK)
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Element offset of (pool row, `kv_head`) in a layer's K or V array.
    #[inline]
    pub fn offset(&self, row: usize, kv_head: usize) -> usize {
        let (block, i) = (row / self.block_size, row % self.block_size);
        (block * self.block_size * self.kv_dim) + (kv_head * self.block_size + i) * self.head_dim
    }

    /// Stores one token's K and V rows (`kv_dim` each, heads in order) of `layer` at pool
    /// row `row`.
    pub fn write_row(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for h in 0..self.kv_dim / hd {
            let at = self.offset(row, h);
            self.k[layer].write(at, &k[h * hd..(h + 1) * hd]);
            self.v[layer].write(at, &v[h * hd..(h + 1) * hd]);
        }
    }

    /// K of (`layer`, pool row, `kv_head`) into `out` (`head_dim` long).
    #[inline]
    pub fn read_k(&self, layer: usize, row: usize, kv_head: usize, out: &mut [f32]) {
        self.k[layer].read(self.offset(row, kv_head), out);
    }

    #[inline]
    pub fn read_v(&self, layer: usize, row: usize, kv_head: usize, out: &mut [f32]) {
        self.v[layer].read(self.offset(row, kv_head), out);
    }

    /// The raw f16 K and V rows of a layer, when the pool stores f16.
    pub fn f16_layer(&self, layer: usize) -> Option<(&[f16], &[f16])> {
        match (&self.k[layer], &self.v[layer]) {
            (Store::F16(k), Store::F16(v)) => Some((k, v)),
            _ => None,
        }
    }

    /// Copies the first `n_positions` rows of block `src` into block `dst`, in every layer.
    pub fn copy_block(&mut self, src: u32, dst: u32, n_positions: usize) {
        let n = n_positions.min(self.block_size) * self.head_dim;
        let (bs, hd) = (self.block_size, self.head_dim);
        for h in 0..self.kv_dim / hd {
            let (s, d) = (
                self.offset(src as usize * bs, h),
                self.offset(dst as usize * bs, h),
            );
            for store in self.k.iter_mut().chain(self.v.iter_mut()) {
                store.copy_within(s, d, n);
            }
        }
    }
}

/// Pool row of position `pos` of a sequence with block table `blocks`.
#[inline]
pub fn row_of(blocks: &[u32], block_size: usize, pos: usize) -> usize {
    blocks[pos / block_size] as usize * block_size + pos % block_size
}

/// One sequence's KV cache (`run`, `chat`, `logits`): a private pool, identity block table,
/// and for hybrid models one recurrent-state slot beside it.
pub struct KvCache {
    pool: KvPool,
    blocks: Vec<u32>,
    /// Positions filled so far (the next token goes at `len`).
    len: usize,
    state: StatePool,
    /// Positions the recurrent state has seen (it cannot be rewound, see [`KvCache::truncate`]).
    state_len: usize,
}

/// Block size of a one-sequence cache (any value works; the table is the identity).
const SINGLE_SEQ_BLOCK: usize = 64;

impl KvCache {
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        ty: KvType,
    ) -> Self {
        let n_blocks = capacity.div_ceil(SINGLE_SEQ_BLOCK).max(1);
        Self {
            pool: KvPool::new(
                n_layers,
                n_kv_heads,
                head_dim,
                n_blocks,
                SINGLE_SEQ_BLOCK,
                ty,
            ),
            blocks: (0..n_blocks as u32).collect(),
            len: 0,
            state: StatePool::empty(),
            state_len: 0,
        }
    }

    /// Keeps the recurrent state of a hybrid model (one slot) beside the K/V.
    pub fn with_state(mut self, state: StatePool) -> Self {
        self.state = state;
        self
    }

    /// Positions the recurrent state holds (equal to `len` unless the cache was truncated
    /// to a middle position, which a hybrid model cannot resume from).
    pub fn state_len(&self) -> usize {
        if self.state.is_stateful() {
            self.state_len
        } else {
            self.len
        }
    }

    pub fn capacity(&self) -> usize {
        self.pool.n_blocks * self.pool.block_size
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kv_type(&self) -> KvType {
        self.pool.ty
    }

    /// Forget positions from `len` on (e.g. to re-run a suffix, or start a new sequence at 0).
    /// A hybrid model's recurrent state cannot be cut: after truncating to a middle position
    /// its next forward call fails ([`crate::ModelError::StateMismatch`]); 0 always works.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        if self.len == 0 {
            self.state_len = 0;
        }
    }

    /// Marks `n` more positions as filled, after every layer wrote them.
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.capacity());
        self.state_len = self.len;
    }

    pub(crate) fn parts(&mut self) -> (&mut KvPool, &mut StatePool, &[u32]) {
        (&mut self.pool, &mut self.state, &self.blocks)
    }

    /// The recurrent state (for snapshots: [`StatePool::slot`] / [`StatePool::slot_mut`]).
    pub fn state(&self) -> &StatePool {
        &self.state
    }
}
