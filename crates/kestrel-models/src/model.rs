//! A loaded model: config, weights by recipe, and the forward pass.

use crate::attention::TokenKv;
use crate::config::{Arch, ModelConfig};
use crate::deltanet::StatePool;
use crate::kv::{row_of, KvCache, KvPool, KvType};
use crate::layers::{Ctx, LayerWeights, SeqSpan};
use crate::ops::{self, MatmulPath, Rope};
use crate::pool::ThreadPool;
use crate::recipes;
use crate::weights::{TensorStore, Weight};
use crate::ModelError;
use kestrel_gguf::{GgmlType, GgufFile};
use std::path::Path;

/// Prompt tokens processed per forward step; bounds activation scratch
/// (`max_batch * ffn_dim` floats) whatever the prompt length.
pub const DEFAULT_MAX_BATCH: usize = 512;

/// How to load and run a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Threads for the matmuls and attention (default: all cores).
    pub threads: usize,
    /// Kernels for the matmuls (default: quantized SIMD kernels).
    pub matmul: MatmulPath,
    /// Tokens per forward step during prefill (default 512).
    pub max_batch: usize,
    /// Quantize a Hugging Face folder's weights at load (`--quantize`); None keeps them as
    /// stored. GGUF files are loaded as they are (quantize them with `kestrel quantize`).
    pub quantize: Option<crate::quantize::QuantMix>,
    /// Holds every matrix (the output head included, the embedding's looked-up rows not) in
    /// this type where it is stored in more bits and its rows divide into the type's blocks: a
    /// draft model's (its proposals only steer, the target checks every one). None keeps them
    /// as stored.
    pub draft_type: Option<GgmlType>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            matmul: MatmulPath::Quantized,
            max_batch: DEFAULT_MAX_BATCH,
            quantize: None,
            draft_type: None,
        }
    }
}

/// Which logits a forward call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// `[vocab]` for the last token only (generation).
    Last,
    /// `[T, vocab]` for every token (parity checks, scoring).
    All,
}

pub struct Model {
    pub config: ModelConfig,
    embed: Weight, // (vocab, dim)
    layers: Vec<LayerWeights>,
    output_norm: Vec<f32>, // (dim)
    output: Weight,        // (vocab, dim); the embedding itself when tied
    pool: ThreadPool,
    opts: LoadOptions,
}

/// Whether `ty` stores a weight in fewer bits than `than`.
fn narrower(ty: GgmlType, than: GgmlType) -> bool {
    let bits = |t: GgmlType| t.bytes_for(256).map_or(u64::MAX, |b| b * 8);
    bits(ty) < bits(than)
}

/// Whether a matrix stored as `stored` with rows of `cols` is held as a copy in a draft's
/// `ty` (`LoadOptions::draft_type`): `ty` is narrower and the rows divide into its blocks.
pub fn draft_copies(ty: GgmlType, stored: GgmlType, cols: usize) -> bool {
    narrower(ty, stored) && ty.bytes_for(cols as u64).is_some()
}

/// `w` as a copy in `ty` where [`draft_copies`] says so (the stored pages, read once for the
/// copy, are dropped); None keeps `w` as it is.
fn held_as(w: &Weight, ty: GgmlType) -> Result<Option<Weight>, ModelError> {
    if !draft_copies(ty, w.ty, w.cols) {
        return Ok(None);
    }
    let copy = w.requantized(ty, &format!("{} ({ty})", w.name))?;
    w.release_pages();
    Ok(Some(copy))
}

impl Model {
    /// Opens a GGUF file or a Hugging Face folder (config.json + *.safetensors).
    pub fn load(
        path: &Path,
        opts: LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        if path.is_dir() {
            let cfg_path = path.join("config.json");
            let text = std::fs::read_to_string(&cfg_path).map_err(|source| ModelError::Io {
                path: cfg_path.clone(),
                source,
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::BadFile {
                    path: cfg_path.clone(),
                    reason: format!("invalid JSON: {e}"),
                })?;
            let cfg = ModelConfig::from_hf_json(&json)?;
            let store = TensorStore::from_hf_dir(path)?;
            let store = match opts.quantize {
                Some(mix) => {
                    crate::quantize::quantize_store(&store, &cfg, mix, opts.threads, progress)?
                }
                None => store,
            };
            Self::from_store(cfg, &store, opts, progress)
        } else {
            if let Some(mix) = opts.quantize {
                return Err(ModelError::Unsupported(format!(
                    "--quantize {} applies to Hugging Face folders; a GGUF file is quantized with `kestrel quantize IN OUT --type {}`",
                    mix.name(),
                    mix.name()
                )));
            }
            let file = GgufFile::open(path)?;
            Self::from_gguf(&file, opts, progress)
        }
    }

    pub fn from_gguf(
        file: &GgufFile,
        opts: LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_gguf(&file.header)?;
        let store = TensorStore::from_gguf(file);
        Self::from_store(cfg, &store, opts, progress)
    }

    fn from_store(
        cfg: ModelConfig,
        store: &TensorStore,
        opts: LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let load_layer = match cfg.arch {
            Arch::Llama => recipes::llama::load_layer,
            Arch::Qwen2 => recipes::qwen2::load_layer,
            Arch::Qwen3 => recipes::qwen3::load_layer,
            Arch::Qwen3Moe => recipes::qwen3moe::load_layer,
            Arch::Qwen35 => recipes::qwen35::load_layer,
        };
        let mut layers = (0..cfg.n_layers)
            .map(|i| load_layer(store, &cfg, i))
            .collect::<Result<Vec<_>, _>>()?;
        let embed = store.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)?;
        let output_name = if store.contains("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let mut output = store.matrix(output_name, cfg.vocab_size, cfg.dim)?;
        // tensors not brought in before the first step (`prefault`)
        let mut lazy = Vec::new();
        if let Some(ty) = opts.draft_type {
            // copies of their own (a tied embedding keeps its rows); the stored matrices, read
            // once for them, are dropped
            for w in layers.iter_mut().flat_map(|l| l.matrices_mut()) {
                if let Some(copy) = held_as(w, ty)? {
                    lazy.push(w.name.clone());
                    *w = copy;
                }
            }
            if let Some(copy) = held_as(&output, ty)? {
                lazy.push(output_name.to_string());
                output = copy;
            }
        }
        let output_norm = recipes::output_norm(store, &cfg)?;
        // An embedding that is not also the output head is read a row per token: its pages come
        // in as rows are looked up.
        if output.name != embed.name {
            embed.release_pages();
            lazy.push("token_embd.weight".to_string());
        }
        let lazy: Vec<&str> = lazy.iter().map(String::as_str).collect();
        store.prefault(&lazy, progress);
        if opts.matmul == MatmulPath::Quantized {
            for l in layers.iter_mut() {
                for w in l.matrices_mut() {
                    w.repack()?;
                }
            }
            output.repack()?;
        }
        Ok(Self {
            embed,
            layers,
            output_norm,
            output,
            pool: ThreadPool::new(opts.threads),
            opts,
            config: cfg,
        })
    }

    pub fn options(&self) -> &LoadOptions {
        &self.opts
    }

    /// Switches the matmul kernels (e.g. to the reference path for parity checks).
    pub fn set_matmul_path(&mut self, path: MatmulPath) {
        self.opts.matmul = path;
    }

    /// Bytes of weights one decode step reads (every matrix once — of a mixture, the router
    /// and the experts a token is routed to — plus one embedding row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_per_token()).sum::<u64>()
            + self.output.bytes().len() as u64
            + self.embed.row_bytes() as u64
    }

    /// A KV cache sized for `capacity` positions (with one recurrent-state slot for hybrid
    /// models).
    pub fn new_cache(&self, capacity: usize, ty: KvType) -> KvCache {
        let c = &self.config;
        KvCache::new(c.n_kv_layers(), c.n_kv_heads, c.head_dim, capacity, ty)
            .with_state(StatePool::new(c, 1))
    }

    /// `n_slots` recurrent-state slots (empty for models without recurrent layers).
    pub fn new_state_pool(&self, n_slots: usize) -> StatePool {
        StatePool::new(&self.config, n_slots)
    }

    /// A block pool shared by many sequences (the serving engine's KV store).
    pub fn new_pool(&self, n_blocks: usize, block_size: usize, ty: KvType) -> KvPool {
        let c = &self.config;
        KvPool::new(
            c.n_kv_layers(),
            c.n_kv_heads,
            c.head_dim,
            n_blocks,
            block_size,
            ty,
        )
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their K/V to the cache and returns
    /// the logits asked for. Long inputs are processed in steps of `max_batch` tokens.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let needed = cache.len() + tokens.len();
        if needed > cache.capacity() {
            return Err(ModelError::ContextFull {
                needed,
                capacity: cache.capacity(),
            });
        }
        if cache.state_len() != cache.len() {
            return Err(ModelError::StateMismatch {
                state: cache.state_len(),
                kv: cache.len(),
            });
        }
        let mut logits = Vec::new();
        let step = self.opts.max_batch.max(1);
        let n_steps = tokens.len().div_ceil(step);
        for (i, chunk) in tokens.chunks(step).enumerate() {
            let last_step = i + 1 == n_steps;
            let want_here = match want {
                Logits::All => WantLogits::All,
                Logits::Last if last_step => WantLogits::Last,
                Logits::Last => WantLogits::None,
            };
            let start = cache.len();
            let (pool, states, blocks) = cache.parts();
            let seq = SeqStep {
                tokens: chunk,
                start,
                blocks,
                slot: 0,
                want: want_here,
            };
            logits.extend(self.forward_batch(pool, states, &[seq])?);
            cache.advance(chunk.len());
        }
        Ok(logits)
    }

    /// One forward pass over the new tokens of several sequences at once: one pass over the
    /// weights serves every sequence (continuous batching). Returns the logits each `SeqStep`
    /// asked for, concatenated in order. This is the hot function of prefill and decode.
    ///
    /// Hybrid models read and update each sequence's recurrent state in `states` (slot
    /// `SeqStep::slot`; a step starting at position 0 clears it first); other models ignore
    /// `states` (pass [`StatePool::empty`]).
    pub fn forward_batch(
        &self,
        pool: &mut KvPool,
        states: &mut StatePool,
        seqs: &[SeqStep],
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let vocab = cfg.vocab_size;
        let bs = pool.block_size();
        // Check every sequence's tokens and table before touching the pool.
        for s in seqs {
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(ModelError::BadToken { id, vocab });
            }
            let end = s.start + s.tokens.len();
            let covered = s.blocks.len() * bs;
            if end > covered || s.blocks.iter().any(|&b| b as usize >= pool.n_blocks()) {
                return Err(ModelError::ContextFull {
                    needed: end,
                    capacity: covered,
                });
            }
            if cfg.hybrid.is_some() && s.slot >= states.n_slots() {
                return Err(ModelError::BadParam {
                    key: "state slot".into(),
                    reason: format!("slot {} of a pool of {}", s.slot, states.n_slots()),
                });
            }
        }
        if cfg.hybrid.is_some() {
            for s in seqs.iter().filter(|s| s.start == 0) {
                states.reset(s.slot);
            }
        }
        let dim = cfg.dim;
        let t_len: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if t_len == 0 {
            return Ok(Vec::new());
        }

        // x: [T, dim], the residual stream, starts as the token embeddings
        let mut x = vec![0f32; t_len * dim];
        let mut tokens = Vec::with_capacity(t_len);
        let mut rows = Vec::with_capacity(t_len);
        let mut positions = Vec::with_capacity(t_len);
        let mut spans = Vec::with_capacity(seqs.len());
        for s in seqs {
            spans.push(SeqSpan {
                t0: tokens.len(),
                len: s.tokens.len(),
                start: s.start,
                slot: s.slot,
            });
            for (i, &tok) in s.tokens.iter().enumerate() {
                let pos = s.start + i;
                let t = tokens.len();
                // A tied output is the embedding table itself, held repacked where it is.
                let table = if self.output.name == self.embed.name {
                    &self.output
                } else {
                    &self.embed
                };
                table.row_f32(tok as usize, &mut x[t * dim..(t + 1) * dim])?;
                tokens.push(TokenKv {
                    pos,
                    blocks: s.blocks,
                    tiled: s.want == WantLogits::Verify,
                });
                rows.push(row_of(s.blocks, bs, pos));
                positions.push(pos);
            }
        }

        let rope = Rope::new(
            &positions,
            cfg.rope_dim,
            cfg.rope_base,
            cfg.rope_layout == crate::config::RopeLayout::NeoX,
        );
        let ctx = Ctx {
            cfg,
            pool: &self.pool,
            path: self.opts.matmul,
            rope: &rope,
            t_len,
            tokens: &tokens,
            rows: &rows,
            seqs: &spans,
        };
        let forward_layer = match cfg.arch {
            Arch::Llama => recipes::llama::forward_layer,
            Arch::Qwen2 => recipes::qwen2::forward_layer,
            // Qwen3-MoE is Qwen3's layer; its FFN routes
            Arch::Qwen3 | Arch::Qwen3Moe => recipes::qwen3::forward_layer,
            Arch::Qwen35 => {
                for (i, layer) in self.layers.iter().enumerate() {
                    recipes::qwen35::forward_layer(&ctx, layer, i, pool, states, &mut x)?;
                }
                return self.logits(seqs, &x);
            }
        };
        for (i, layer) in self.layers.iter().enumerate() {
            forward_layer(&ctx, layer, i, pool, &mut x)?;
        }
        self.logits(seqs, &x)
    }

    /// The final norm and the vocabulary projection, for the rows each sequence asked for.
    fn logits(&self, seqs: &[SeqStep], x: &[f32]) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let (dim, vocab) = (cfg.dim, cfg.vocab_size);
        let mut picked = Vec::new();
        let mut t0 = 0;
        for s in seqs {
            let n = s.tokens.len();
            match s.want {
                WantLogits::None => {}
                WantLogits::Last => {
                    picked.extend_from_slice(&x[(t0 + n - 1) * dim..(t0 + n) * dim])
                }
                WantLogits::All | WantLogits::Verify => {
                    picked.extend_from_slice(&x[t0 * dim..(t0 + n) * dim])
                }
            }
            t0 += n;
        }
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        ops::rms_norm(&mut picked, &self.output_norm, cfg.rms_eps);
        let n = picked.len() / dim;
        let mut logits = vec![0f32; n * vocab];
        ops::matmul(
            &self.pool,
            self.opts.matmul,
            &self.output,
            &picked,
            &mut logits,
        )?;
        Ok(logits)
    }
}

/// Which logits a sequence of a batched step wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WantLogits {
    None,
    Last,
    All,
    /// Every token's, to check speculative proposals: as `All`, with the step's queries of
    /// the sequence attending together (one pass over its cache instead of one per token).
    Verify,
}

/// One sequence's share of a batched forward step.
pub struct SeqStep<'a> {
    /// New tokens: a prefill chunk, or the one token of a decode step.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; positions `0..start` are already in the sequence's blocks.
    pub start: usize,
    /// Block table covering positions `0..start + tokens.len()`.
    pub blocks: &'a [u32],
    /// Recurrent-state slot of the sequence (hybrid models; ignored by the others).
    pub slot: usize,
    pub want: WantLogits,
}
