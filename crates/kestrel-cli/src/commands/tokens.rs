//! `kestrel tokenize`, `detokenize` and `template`.

use crate::source::ModelSource;
use anyhow::{Context, Result};
use std::path::Path;

pub fn tokenize(
    model: &Path,
    text: &str,
    add_special: bool,
    parse_special: bool,
    pieces: bool,
) -> Result<()> {
    let src = ModelSource::open(model)?;
    let ids = src.tokenizer.encode(text, add_special, parse_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    if pieces {
        let p: Vec<String> = ids
            .iter()
            .map(|&id| src.tokenizer.decode(&[id], false))
            .collect();
        println!("{}", serde_json::to_string(&p)?);
    }
    Ok(())
}

pub fn detokenize(model: &Path, ids: &str) -> Result<()> {
    let src = ModelSource::open(model)?;
    let ids = crate::parse_ids(ids)?;
    let vocab = src.tokenizer.vocab_size();
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        anyhow::bail!("token id {bad} is outside the vocabulary (size {vocab})");
    }
    println!("{}", src.tokenizer.decode(&ids, false));
    Ok(())
}

pub fn template(
    model: &Path,
    messages: &Path,
    tools: Option<&Path>,
    add_generation_prompt: bool,
) -> Result<()> {
    let src = ModelSource::open(model)?;
    let read = |p: &Path| -> Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", p.display()))
    };
    let messages = read(messages)?;
    let tools = tools.map(read).transpose()?;
    let template = crate::generate::chat_template(&src)?;
    let messages = messages
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("--messages must hold a JSON array of messages"))?;
    // The server's normalization (multi-part content, developer role, tool-call turns).
    let messages = kestrel_server::validate::normalize_messages(messages)
        .map_err(|e| anyhow::anyhow!("--messages: {}", e.message))?;
    let tools = match &tools {
        Some(t) => Some(
            t.as_array()
                .ok_or_else(|| anyhow::anyhow!("--tools must hold a JSON array"))?
                .as_slice(),
        ),
        None => None,
    };
    let prompt = template.apply(&messages, tools, add_generation_prompt)?;
    print!("{prompt}");
    Ok(())
}
