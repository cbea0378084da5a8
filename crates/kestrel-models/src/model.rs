//! A loaded model: config, weights by recipe, and the forward pass.

use crate::config::{Arch, ModelConfig};
use crate::kv::{KvCache, KvType};
use crate::layers::{Ctx, LayerWeights};
use crate::ops::{self, MatmulPath, Rope};
use crate::pool::ThreadPool;
use crate::recipes;
use crate::weights::{TensorStore, Weight};
use crate::ModelError;
use kestrel_gguf::GgufFile;
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
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            matmul: MatmulPath::Quantized,
            max_batch: DEFAULT_MAX_BATCH,
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
            Self::from_store(cfg, &store, opts, progress)
        } else {
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
        };
        let layers = (0..cfg.n_layers)
            .map(|i| load_layer(store, &cfg, i))
            .collect::<Result<Vec<_>, _>>()?;
        let embed = store.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)?;
        let output_name = if store.contains("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let output = store.matrix(output_name, cfg.vocab_size, cfg.dim)?;
        let output_norm = store.vector("output_norm.weight", cfg.dim)?;
        store.prefault(progress);
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

    /// Bytes of weights one decode step reads (every matrix once, plus one embedding row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let mats = self.layers.iter().flat_map(|l| {
            [
                &l.attn.wq,
                &l.attn.wk,
                &l.attn.wv,
                &l.attn.wo,
                &l.mlp.gate,
                &l.mlp.up,
                &l.mlp.down,
            ]
        });
        mats.map(|w| w.bytes().len() as u64).sum::<u64>()
            + self.output.bytes().len() as u64
            + self.embed.row_bytes() as u64
    }

    /// A KV cache sized for `capacity` positions.
    pub fn new_cache(&self, capacity: usize, ty: KvType) -> KvCache {
        let c = &self.config;
        KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim, capacity, ty)
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their K/V to the cache and returns
    /// the logits asked for. Long inputs are processed in steps of `max_batch` tokens.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let vocab = self.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { id, vocab });
        }
        let needed = cache.len() + tokens.len();
        if needed > cache.capacity() {
            return Err(ModelError::ContextFull {
                needed,
                capacity: cache.capacity(),
            });
        }
        let mut logits = Vec::new();
        let step = self.opts.max_batch.max(1);
        let n_steps = tokens.len().div_ceil(step);
        for (i, chunk) in tokens.chunks(step).enumerate() {
            let last_step = i + 1 == n_steps;
            let want_here = match want {
                Logits::All => Some(Logits::All),
                Logits::Last if last_step => Some(Logits::Last),
                Logits::Last => None,
            };
            logits.extend(self.forward_step(chunk, cache, want_here)?);
        }
        Ok(logits)
    }

    /// One batch of tokens through every layer (the hot function of prefill and decode).
    fn forward_step(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        want: Option<Logits>,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let (t_len, dim) = (tokens.len(), cfg.dim);
        let start = cache.len();

        // x: [T, dim], the residual stream, starts as the token embeddings
        let mut x = vec![0f32; t_len * dim];
        for (row, &tok) in x.chunks_exact_mut(dim).zip(tokens) {
            self.embed.row_f32(tok as usize, row)?;
        }

        let positions: Vec<usize> = (start..start + t_len).collect();
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
            start,
            t_len,
        };
        let forward_layer = match cfg.arch {
            Arch::Llama => recipes::llama::forward_layer,
            Arch::Qwen2 => recipes::qwen2::forward_layer,
            Arch::Qwen3 => recipes::qwen3::forward_layer,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            forward_layer(&ctx, layer, i, cache, &mut x)?;
        }
        cache.advance(t_len);

        // final norm and the vocabulary projection, for the rows asked for
        let rows = match want {
            None => return Ok(Vec::new()),
            Some(Logits::All) => &mut x[..],
            Some(Logits::Last) => &mut x[(t_len - 1) * dim..],
        };
        ops::rms_norm(rows, &self.output_norm, cfg.rms_eps);
        let n = rows.len() / dim;
        let mut logits = vec![0f32; n * cfg.vocab_size];
        ops::matmul(
            &self.pool,
            self.opts.matmul,
            &self.output,
            rows,
            &mut logits,
        )?;
        Ok(logits)
    }
}
