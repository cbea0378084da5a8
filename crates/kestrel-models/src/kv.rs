//! The KV cache of one sequence, as the model sees it.
//!
//! Recipes reach cached keys and values only through [`KvCache`]'s narrow surface: `write` the
//! new tokens' K/V rows of a layer, then read them back per position and kv-head. The paged,
//! shared store of the serving engine implements the same surface.

use half::f16;

/// Element type of cached K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Store {
    fn new(ty: KvType, len: usize) -> Self {
        match ty {
            KvType::F32 => Store::F32(vec![0.0; len]),
            KvType::F16 => Store::F16(vec![f16::ZERO; len]),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Store::F16(v) => {
                for (d, s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(*s);
                }
            }
        }
    }

    fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            Store::F32(v) => out.copy_from_slice(&v[at..at + out.len()]),
            Store::F16(v) => {
                let n = out.len();
                for (d, s) in out.iter_mut().zip(&v[at..at + n]) {
                    *d = s.to_f32();
                }
            }
        }
    }
}

/// Keys and values of every layer for positions `0..capacity`; layout per layer `[pos, kv_dim]`.
pub struct KvCache {
    k: Vec<Store>,
    v: Vec<Store>,
    kv_dim: usize,
    head_dim: usize,
    capacity: usize,
    /// Positions filled so far (the next token goes at `len`).
    len: usize,
    ty: KvType,
}

impl KvCache {
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        ty: KvType,
    ) -> Self {
        let kv_dim = n_kv_heads * head_dim;
        Self {
            k: (0..n_layers)
                .map(|_| Store::new(ty, capacity * kv_dim))
                .collect(),
            v: (0..n_layers)
                .map(|_| Store::new(ty, capacity * kv_dim))
                .collect(),
            kv_dim,
            head_dim,
            capacity,
            len: 0,
            ty,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    /// Forget positions from `len` on (e.g. to re-run a suffix, or start a new sequence at 0).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Marks `n` more positions as filled, after every layer wrote them.
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.capacity);
    }

    /// Stores K and V rows (`[T, kv_dim]`) of `layer` for positions `start..start+T`.
    pub fn write(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        self.k[layer].write(start * self.kv_dim, k);
        self.v[layer].write(start * self.kv_dim, v);
    }

    /// K of (`layer`, `pos`, `kv_head`) into `out` (`head_dim` long).
    #[inline]
    pub fn read_k(&self, layer: usize, pos: usize, kv_head: usize, out: &mut [f32]) {
        self.k[layer].read(pos * self.kv_dim + kv_head * self.head_dim, out);
    }

    /// The raw f16 K and V of a layer (`[pos, kv_dim]`), when the cache stores f16.
    pub fn f16_layer(&self, layer: usize) -> Option<(&[f16], &[f16])> {
        match (&self.k[layer], &self.v[layer]) {
            (Store::F16(k), Store::F16(v)) => Some((k, v)),
            _ => None,
        }
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    #[inline]
    pub fn read_v(&self, layer: usize, pos: usize, kv_head: usize, out: &mut [f32]) {
        self.v[layer].read(pos * self.kv_dim + kv_head * self.head_dim, out);
    }
}
