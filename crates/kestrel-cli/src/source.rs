//! Opening what `-m MODEL` names: a GGUF file or a Hugging Face folder.

use anyhow::{Context, Result};
use kestrel_gguf::{GgmlType, GgufFile, Value};
use kestrel_models::{LoadOptions, Model, ModelConfig};
use kestrel_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct ModelSource {
    pub path: PathBuf,
    pub format: &'static str,
    pub file_bytes: u64,
    pub name: Option<String>,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<String>,
    /// (type name, bytes) of every tensor.
    pub tensor_types: Vec<(String, u64)>,
    /// Sum of every tensor's size from its type and shape.
    pub weight_bytes: u64,
    /// Weight bytes one decoded token reads (of a mixture, the experts it is routed to).
    pub read_bytes_per_token: u64,
    /// The type a draft's matrices are held in where stored in more bits ([`Self::into_draft`]).
    draft_type: Option<GgmlType>,
    gguf: Option<GgufFile>,
}

/// The type a draft model's matrices are held in: its proposals only steer (the target checks
/// every one), and a small model's decode step is bound by the bytes it reads. The 0.5B's file
/// stores most of its matrices as Q5_0 and Q6_K and its head (151,936 x 896, 29% of the file) as
/// Q8_0; in Q4_0 (any width of 32s; the K-quants need 256s, and 896 is not) a proposal reads
/// 29% fewer bytes (392 -> 278 MB). BENCHMARKS.md has the A/B.
pub const DRAFT_TYPE: GgmlType = GgmlType::Q4_0;

/// (name, type, rows, columns) of a GGUF tensor seen as a matrix (ggml dims: row length first).
fn matrix_shape(t: &kestrel_gguf::TensorInfo) -> (&str, GgmlType, usize, usize) {
    let rows = t.dims.iter().skip(1).product::<u64>() as usize;
    let cols = t.dims.first().copied().unwrap_or(0) as usize;
    (t.name.as_str(), t.ggml_type, rows, cols)
}

/// A GGUF tensor as a draft holds it ([`ModelSource::into_draft`]).
struct DraftTensor<'a> {
    name: &'a str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Held as a copy in [`DRAFT_TYPE`] (the stored matrix dropped once copied).
    copied: bool,
}

impl<'a> DraftTensor<'a> {
    /// Matrices stored in more bits than [`DRAFT_TYPE`] whose rows divide into its blocks are
    /// copied, but for an untied embedding (looked up a row at a time).
    fn of(t: &'a kestrel_gguf::TensorInfo, untied: bool) -> Self {
        let (name, ty, rows, cols) = matrix_shape(t);
        let copied = t.dims.len() == 2
            && !(untied && name == "token_embd.weight")
            && kestrel_models::model::draft_copies(DRAFT_TYPE, ty, cols);
        let ty = if copied { DRAFT_TYPE } else { ty };
        Self {
            name,
            ty,
            rows,
            cols,
            copied,
        }
    }
}

impl ModelSource {
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::open_hf(path);
        }
        let file = GgufFile::open(path)?;
        let h = &file.header;
        let config = ModelConfig::from_gguf(h)?;
        let tokenizer = Arc::new(Tokenizer::from_gguf(h)?);
        let chat_template = h
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        let tensor_types = h
            .tensors
            .iter()
            .map(|t| (t.ggml_type.to_string(), t.n_bytes))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            format: "GGUF",
            file_bytes: file.file_len(),
            name: h
                .get("general.name")
                .and_then(Value::as_str)
                .map(str::to_string),
            // What stays resident: every tensor, plus the padding of the matrices repacked at
            // load for the SIMD kernels (their mapped pages are released).
            weight_bytes: h.tensor_bytes()
                + kestrel_models::weights::repack_extra_bytes(h.tensors.iter().map(matrix_shape)),
            read_bytes_per_token: kestrel_models::plan::read_bytes_per_token(
                &config,
                h.tensors.iter().map(|t| (t.name.as_str(), t.n_bytes)),
            ),
            config,
            tokenizer,
            chat_template,
            tensor_types,
            draft_type: None,
            gguf: Some(file),
        })
    }

    fn open_hf(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .with_context(|| format!("reading {}", cfg_path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", cfg_path.display()))?;
        let config = ModelConfig::from_hf_json(&json)?;
        let tokenizer = Arc::new(Tokenizer::from_hf_dir(dir)?);
        let store = kestrel_models::weights::TensorStore::from_hf_dir(dir)?;
        let list = store.list();
        let weight_bytes = list.iter().map(|(_, _, b)| b).sum();
        let read_bytes_per_token = kestrel_models::plan::read_bytes_per_token(
            &config,
            list.iter().map(|(n, _, b)| (n.as_str(), *b)),
        );
        let file_bytes = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        Ok(Self {
            path: dir.to_path_buf(),
            format: "Hugging Face safetensors folder",
            file_bytes,
            name: json["_name_or_path"].as_str().map(str::to_string),
            chat_template: tokenizer.chat_template_source().map(str::to_string),
            config,
            tokenizer,
            tensor_types: list
                .into_iter()
                .map(|(_, ty, b)| (ty.to_string(), b))
                .collect(),
            weight_bytes,
            read_bytes_per_token,
            draft_type: None,
            gguf: None,
        })
    }

    /// The plan of this model with `--quantize mix` applied (a folder's weights quantized at
    /// load): the weight sizes become the quantized ones. None leaves it as it is.
    pub fn quantized(mut self, mix: Option<kestrel_models::quantize::QuantMix>) -> Result<Self> {
        let Some(mix) = mix else {
            return Ok(self);
        };
        if self.gguf.is_some() {
            anyhow::bail!(
                "--quantize {} applies to Hugging Face folders; {} is a GGUF file (quantize it with `kestrel quantize IN OUT --type {}`)",
                mix.name(),
                self.path.display(),
                mix.name()
            );
        }
        let store = kestrel_models::weights::TensorStore::from_hf_dir(&self.path)?;
        let planned = kestrel_models::quantize::quantized_tensors(&store, &self.config, mix)?;
        self.weight_bytes = planned.iter().map(|(_, _, b)| b).sum();
        self.read_bytes_per_token = kestrel_models::plan::read_bytes_per_token(
            &self.config,
            planned.iter().map(|(n, _, b)| (n.as_str(), *b)),
        );
        self.tensor_types = planned
            .into_iter()
            .map(|(_, ty, b)| (ty.to_string(), b))
            .collect();
        Ok(self)
    }

    /// This GGUF model as a speculative draft: its matrices held as [`DRAFT_TYPE`] where the
    /// file stores them in more bits (`KESTREL_DRAFT_WEIGHTS=stored` keeps them, for A/B
    /// figures), the resident bytes planned with the copies (the stored matrices are dropped
    /// once copied). Folders stay as stored.
    pub fn into_draft(mut self) -> Self {
        let keep = std::env::var("KESTREL_DRAFT_WEIGHTS").is_ok_and(|v| v == "stored");
        let Some(file) = self.gguf.as_ref().filter(|_| !keep) else {
            return self;
        };
        let tensors = &file.header.tensors;
        let untied = tensors.iter().any(|t| t.name == "output.weight");
        let held: Vec<_> = tensors.iter().map(|t| DraftTensor::of(t, untied)).collect();
        if !held.iter().any(|t| t.copied) {
            return self;
        }
        // as mapped, less the stored matrices that were copied (a tied embedding keeps its
        // rows), plus the copies and the repacked forms
        let (mut dropped, mut copies) = (0, 0);
        for (t, h) in tensors.iter().zip(&held).filter(|(_, h)| h.copied) {
            if t.name != "token_embd.weight" {
                dropped += t.n_bytes;
            }
            copies += h.ty.bytes_for(h.cols as u64).unwrap_or(0) * h.rows as u64;
        }
        let shapes = held.iter().map(|h| (h.name, h.ty, h.rows, h.cols));
        self.weight_bytes = file.header.tensor_bytes() - dropped
            + copies
            + kestrel_models::weights::repack_extra_bytes(shapes);
        self.draft_type = Some(DRAFT_TYPE);
        self
    }

    /// The type a draft's matrices are held in, where it differs from the file's.
    pub fn draft_type(&self) -> Option<GgmlType> {
        self.draft_type
    }

    /// The tensor index (what a GPU backend uploads from).
    pub fn tensor_store(&self) -> Result<kestrel_models::weights::TensorStore> {
        Ok(match &self.gguf {
            Some(file) => kestrel_models::weights::TensorStore::from_gguf(file),
            None => kestrel_models::weights::TensorStore::from_hf_dir(&self.path)?,
        })
    }

    /// Bytes of every tensor as stored (what a GPU holds: no CPU repacking).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_types.iter().map(|(_, b)| b).sum()
    }

    /// Loads the weights, showing a progress bar on stderr while pages are brought in.
    pub fn load_model(&self, opts: LoadOptions, quiet: bool) -> Result<Model> {
        let bar = if quiet {
            indicatif::ProgressBar::hidden()
        } else {
            let b = indicatif::ProgressBar::new(self.weight_bytes);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "loading {bar:30} {bytes}/{total_bytes} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        };
        let mut progress = |done: u64, total: u64| {
            bar.set_length(total);
            bar.set_position(done);
        };
        let opts = LoadOptions {
            draft_type: self.draft_type.or(opts.draft_type),
            ..opts
        };
        let model = match &self.gguf {
            Some(file) => Model::from_gguf(file, opts, &mut progress)?,
            None => Model::load(&self.path, opts, &mut progress)?,
        };
        bar.finish_and_clear();
        Ok(model)
    }
}
