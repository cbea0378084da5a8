//! `kestrel logits`: every prompt position's logits, for parity checks against other engines.

use crate::source::ModelSource;
use anyhow::{Context, Result};
use kestrel_models::{LoadOptions, Logits, MatmulPath};
use std::path::Path;

pub fn run(
    model: &Path,
    prompt_ids: &str,
    out: &Path,
    reference: bool,
    threads: Option<usize>,
    kv_type: &str,
    device: crate::gpu::Device,
) -> Result<()> {
    let src = ModelSource::open(model)?;
    let ids = crate::parse_ids(prompt_ids)?;
    anyhow::ensure!(!ids.is_empty(), "--prompt-ids is empty");
    if let Some(logits) = crate::gpu::logits(&src, &ids, device, reference)? {
        return write(out, &logits, ids.len(), src.config.vocab_size);
    }
    let mut opts = LoadOptions::default();
    if let Some(t) = threads {
        opts.threads = t;
    }
    if reference {
        opts.matmul = MatmulPath::Reference;
    }
    let m = src.load_model(opts, true)?;
    let kv = crate::commands::run::parse_kv_type(kv_type, &src)?;
    let mut cache = m.new_cache(ids.len(), kv);
    let logits = m.forward(&ids, &mut cache, Logits::All)?;
    write(out, &logits, ids.len(), m.config.vocab_size)
}

/// Writes `[n, vocab]` logits as the safetensors file `out`.
fn write(out: &Path, logits: &[f32], n: usize, vocab: usize) -> Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![n, vocab], &bytes)?;
    safetensors::serialize_to_file([("logits", view)], &None, out)
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote logits [{n}, {vocab}] to {}", out.display());
    Ok(())
}
