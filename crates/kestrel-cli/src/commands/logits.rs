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
) -> Result<()> {
    let src = ModelSource::open(model)?;
    let ids = crate::parse_ids(prompt_ids)?;
    anyhow::ensure!(!ids.is_empty(), "--prompt-ids is empty");
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
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(
        safetensors::Dtype::F32,
        vec![ids.len(), m.config.vocab_size],
        &bytes,
    )?;
    safetensors::serialize_to_file([("logits", view)], &None, out)
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "wrote logits [{}, {}] to {}",
        ids.len(),
        m.config.vocab_size,
        out.display()
    );
    Ok(())
}
