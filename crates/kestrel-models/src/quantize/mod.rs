//! Quantizing a model yourself: `kestrel quantize` (an F32/F16/BF16 GGUF or a Hugging Face
//! folder in, a quantized GGUF out) and `--quantize` at load (a folder quantized in memory,
//! tensor by tensor).
//!
//! Data flow: [`plan`] lists the output tensors in file order (GGUF names; a folder's
//! per-expert tensors joined into GGUF's 3-D ones; llama's q/k rows in GGUF's RoPE order) and
//! gives each its type ([`mixture`], llama.cpp's rules); [`write_gguf`] streams every tensor
//! row by row (decode to f32, quantize, write), releasing the source pages behind it;
//! [`quantize_store`] does the same into memory for loading. Both paths quantize the same rows
//! with the same quantizers, so their logits are equal.

mod hf_meta;
pub mod mixture;

pub use mixture::QuantMix;

use crate::config::{Arch, ModelConfig};
use crate::weights::TensorStore;
use crate::ModelError;
use kestrel_gguf::{GgmlType, Header, TensorSpec, Value};
use mixture::ModelFacts;
use std::path::Path;

/// One output tensor: its name, type and shape, and where its rows come from.
#[derive(Debug, Clone)]
pub struct Planned {
    pub spec: TensorSpec,
    /// Type in the source.
    pub source_type: GgmlType,
    /// Source tensors whose rows, in order, make this one (several for a folder's experts).
    parts: Vec<String>,
    /// Heads whose rows are reordered from Hugging Face's rotate-half RoPE to GGUF's
    /// interleaved one (llama's q and k).
    permute_heads: Option<usize>,
}

impl Planned {
    /// A tensor written as it is stored: one source tensor, rows in order.
    fn as_stored(name: &str, ty: GgmlType, dims: Vec<u64>) -> Self {
        Self {
            spec: TensorSpec {
                name: name.to_string(),
                ty,
                dims,
            },
            source_type: ty,
            parts: vec![name.to_string()],
            permute_heads: None,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.spec.n_bytes().unwrap_or(0)
    }

    fn source_bytes(&self) -> u64 {
        let rows: u64 = self.spec.dims.iter().skip(1).product();
        self.source_type
            .bytes_for(self.spec.dims.first().copied().unwrap_or(0))
            .unwrap_or(0)
            * rows
    }
}

/// The output of a quantization: metadata and tensors, in file order.
pub struct QuantPlan {
    pub mix: QuantMix,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<Planned>,
}

impl QuantPlan {
    /// Bytes of tensor data before and after.
    pub fn sizes(&self) -> (u64, u64) {
        let before = self.tensors.iter().map(Planned::source_bytes).sum();
        let after = self.tensors.iter().map(Planned::bytes).sum();
        (before, after)
    }

    /// Elements of every tensor (for bits per weight).
    pub fn n_elements(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.spec.dims.iter().product::<u64>())
            .sum()
    }
}

fn bad(reason: String) -> ModelError {
    ModelError::BadParam {
        key: "quantize".into(),
        reason,
    }
}

/// Plans the quantization of `store` (read from `header` when it is a GGUF file).
pub fn plan(
    store: &TensorStore,
    cfg: &ModelConfig,
    header: Option<&Header>,
    mix: QuantMix,
) -> Result<QuantPlan, ModelError> {
    let mut tensors = match header {
        Some(h) => h
            .tensors
            .iter()
            .map(|t| Planned::as_stored(&t.name, t.ggml_type, t.dims.clone()))
            .collect(),
        None => plan_folder(store, cfg)?,
    };
    refuse_quantized(&tensors)?;
    llama_order(&mut tensors);
    assign_types(&mut tensors, cfg, mix);
    let metadata = match header {
        Some(h) => gguf_metadata(h, mix),
        None => hf_meta::metadata(&store.path, cfg, mix)?,
    };
    Ok(QuantPlan {
        mix,
        metadata,
        tensors,
    })
}

/// A source whose weights are already quantized is refused: quantizing twice loses precision.
fn refuse_quantized(tensors: &[Planned]) -> Result<(), ModelError> {
    for t in tensors {
        let floats = matches!(
            t.source_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
        );
        if mixture::quantizable(&t.spec.name, t.spec.dims.len()) && !floats {
            return Err(bad(format!(
                "tensor '{}' is already {}: quantize from the F32/F16/BF16 original (quantizing twice loses precision)",
                t.spec.name, t.source_type
            )));
        }
    }
    Ok(())
}

/// llama.cpp's order of tensors (its loader's `weight_name_comparer`): by layer, the
/// tensors outside layers first, then by name. Its quantizer counts attention-v tensors and
/// writes its output in this order, so both are done in it here.
fn llama_order(tensors: &mut [Planned]) {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse().ok())
            .unwrap_or(-1)
    };
    tensors.sort_by(|a, b| {
        (layer(&a.spec.name), &a.spec.name).cmp(&(layer(&b.spec.name), &b.spec.name))
    });
}

/// Gives every planned tensor its type under `mix`, in order (attention-v tensors are
/// counted in the order they come, as llama.cpp does).
fn assign_types(tensors: &mut [Planned], cfg: &ModelConfig, mix: QuantMix) {
    let is_attn_v = |n: &str| n.contains("attn_v.weight") || n.contains("attn_qkv.weight");
    let facts = ModelFacts {
        n_layers: cfg.n_layers,
        n_experts: cfg.moe.as_ref().map_or(0, |m| m.n_experts),
        n_attn_v: tensors.iter().filter(|t| is_attn_v(&t.spec.name)).count(),
        tied: !tensors.iter().any(|t| t.spec.name == "output.weight"),
    };
    let mut attn_v_index = 0;
    for t in tensors.iter_mut() {
        let name = t.spec.name.clone();
        t.spec.ty = mixture::target_type(
            mix,
            &name,
            &t.spec.dims,
            t.source_type,
            &facts,
            attn_v_index,
        );
        if is_attn_v(&name) {
            attn_v_index += 1;
        }
    }
}

/// A GGUF source's metadata with the new file type.
fn gguf_metadata(h: &Header, mix: QuantMix) -> Vec<(String, Value)> {
    let mut md: Vec<(String, Value)> = h
        .metadata
        .iter()
        .filter(|(k, _)| k != "general.file_type" && k != "general.quantization_version")
        .cloned()
        .collect();
    md.push(("general.file_type".into(), Value::U32(mix.file_type())));
    md.push(("general.quantization_version".into(), Value::U32(2)));
    md
}

/// A folder's tensors under GGUF names.
fn plan_folder(store: &TensorStore, cfg: &ModelConfig) -> Result<Vec<Planned>, ModelError> {
    if cfg.arch == Arch::Qwen35 {
        return Err(bad(
            "a Qwen3.5 folder: its tensors need the converter's transforms; convert it with llama.cpp's convert_hf_to_gguf.py first, or load the folder with --quantize".into(),
        ));
    }
    let mut out: Vec<Planned> = Vec::new();
    let mut experts: Vec<(String, Vec<(usize, String)>)> = Vec::new();
    for (name, ty, _) in store.list() {
        let (_, dims, _) = store
            .raw(&name)
            .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
        // `blk.L.ffn_up_exps.E.weight` joins `blk.L.ffn_up_exps.weight`
        if let Some((stem, e)) = expert_part(&name) {
            match experts.iter_mut().find(|(s, _)| *s == stem) {
                Some((_, parts)) => parts.push((e, name.clone())),
                None => experts.push((stem, vec![(e, name.clone())])),
            }
            continue;
        }
        let mut t = Planned::as_stored(&name, ty, dims.iter().map(|&d| d as u64).collect());
        t.permute_heads = match (cfg.arch, name.rsplit_once('.').map(|p| p.0)) {
            (Arch::Llama, Some(n)) if n.ends_with("attn_q") => Some(cfg.n_heads),
            (Arch::Llama, Some(n)) if n.ends_with("attn_k") => Some(cfg.n_kv_heads),
            _ => None,
        };
        out.push(t);
    }
    for (stem, mut parts) in experts {
        parts.sort();
        let first = &parts[0].1;
        let (ty, dims, _) = store
            .raw(first)
            .ok_or_else(|| ModelError::MissingTensor(first.clone()))?;
        if parts.iter().enumerate().any(|(i, (e, _))| *e != i) {
            return Err(bad(format!("the experts of {stem} are not numbered 0..n")));
        }
        let mut d: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        d.push(parts.len() as u64);
        out.push(Planned {
            spec: TensorSpec {
                name: format!("{stem}.weight"),
                ty,
                dims: d,
            },
            source_type: ty,
            parts: parts.into_iter().map(|(_, n)| n).collect(),
            permute_heads: None,
        });
    }
    Ok(out)
}

/// `blk.3.ffn_up_exps.7.weight` -> (`blk.3.ffn_up_exps`, 7).
fn expert_part(name: &str) -> Option<(String, usize)> {
    let rest = name.strip_suffix(".weight")?;
    let (stem, e) = rest.rsplit_once('.')?;
    if !stem.ends_with("_exps") {
        return None;
    }
    Some((stem.to_string(), e.parse().ok()?))
}

/// Source row of output row `r` for a tensor whose heads are reordered from rotate-half to
/// interleaved pairs: output `(h, i, j)` is input `(h, j, i)` over `[heads, 2, head_dim / 2]`.
fn source_row(r: usize, rows: usize, heads: Option<usize>) -> usize {
    let Some(h) = heads.filter(|&h| h > 0 && rows.is_multiple_of(2 * h)) else {
        return r;
    };
    let hd = rows / h;
    let (head, within) = (r / hd, r % hd);
    let (i, j) = (within / 2, within % 2);
    head * hd + j * (hd / 2) + i
}

/// Rows `rows` of planned tensor `t`, quantized to its type, into `out` (rows in parallel over
/// `threads`).
fn quantize_rows(
    store: &TensorStore,
    t: &Planned,
    rows: std::ops::Range<usize>,
    threads: usize,
    out: &mut [u8],
) -> Result<(), ModelError> {
    let cols = t.spec.dims.first().copied().unwrap_or(0) as usize;
    let total_rows: usize = t.spec.dims.iter().skip(1).product::<u64>() as usize;
    let per_part = total_rows / t.parts.len().max(1);
    if per_part == 0 || cols == 0 || rows.is_empty() {
        return Ok(()); // an empty tensor: nothing to write
    }
    let src_row_bytes = t.source_type.bytes_for(cols as u64).unwrap_or(0) as usize;
    let dst_row_bytes = t.spec.ty.bytes_for(cols as u64).unwrap_or(0) as usize;
    let parts: Vec<&[u8]> = t
        .parts
        .iter()
        .map(|p| {
            store
                .raw(p)
                .map(|(_, _, b)| b)
                .ok_or_else(|| ModelError::MissingTensor(p.clone()))
        })
        .collect::<Result<_, _>>()?;
    let n = rows.len();
    let chunk = n.div_ceil(threads.max(1)).max(1);
    let results: Vec<Result<(), ModelError>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(chunk * dst_row_bytes.max(1))
            .enumerate()
            .map(|(ci, dst)| {
                let parts = &parts;
                let first = rows.start + ci * chunk;
                s.spawn(move || -> Result<(), ModelError> {
                    let mut f = vec![0f32; cols];
                    for (k, o) in dst.chunks_exact_mut(dst_row_bytes.max(1)).enumerate() {
                        let r = first + k;
                        let (part, pr) = (r / per_part, r % per_part);
                        let pr = source_row(pr, per_part, t.permute_heads);
                        let src = &parts[part][pr * src_row_bytes..(pr + 1) * src_row_bytes];
                        kestrel_quant::dequantize_row(t.source_type, src, &mut f)?;
                        kestrel_quant::quantize_row(t.spec.ty, &f, o)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(bad("a quantizer thread panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Rows per streamed piece of a tensor: bounds the memory a quantizer holds at once.
const ROWS_PER_PIECE: usize = 1024;

/// Writes `plan` as a GGUF file at `out`, streaming each tensor in pieces.
/// `progress(done_bytes, total_bytes)` is called as source bytes are processed.
pub fn write_gguf(
    store: &TensorStore,
    plan: &QuantPlan,
    out: &Path,
    threads: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), ModelError> {
    let specs: Vec<TensorSpec> = plan.tensors.iter().map(|t| t.spec.clone()).collect();
    let total: u64 = plan.tensors.iter().map(Planned::source_bytes).sum();
    let mut done = 0u64;
    let mut failure: Option<ModelError> = None;
    let io_err = |source| kestrel_gguf::GgufError::Io {
        path: out.to_path_buf(),
        source,
    };
    let written = kestrel_gguf::write_gguf(out, &plan.metadata, &specs, |i, w| {
        let t = &plan.tensors[i];
        let rows: usize = t.spec.dims.iter().skip(1).product::<u64>() as usize;
        let cols = t.spec.dims.first().copied().unwrap_or(0);
        let dst_row = t.spec.ty.bytes_for(cols).unwrap_or(0) as usize;
        let src_row = t.source_type.bytes_for(cols).unwrap_or(0);
        let mut buf = Vec::new();
        for lo in (0..rows).step_by(ROWS_PER_PIECE) {
            let hi = (lo + ROWS_PER_PIECE).min(rows);
            buf.resize((hi - lo) * dst_row, 0);
            if let Err(e) = quantize_rows(store, t, lo..hi, threads, &mut buf) {
                failure = Some(e);
                return Err(kestrel_gguf::GgufError::BadTensor {
                    name: t.spec.name.clone(),
                    reason: "quantization failed".into(),
                });
            }
            w.write_all(&buf).map_err(io_err)?;
            done += (hi - lo) as u64 * src_row;
            progress(done, total);
        }
        for p in &t.parts {
            store.release(p);
        }
        Ok(())
    });
    match (failure, written) {
        (Some(e), _) => Err(e),
        (None, r) => Ok(r?),
    }
}

/// The tensors of `store` quantized in memory under `mix` (a folder loaded with
/// `--quantize`): each tensor is quantized row by row and its mapped pages released, so the
/// unquantized model is never resident at once. Tensors the mixture leaves alone stay mapped.
pub fn quantize_store(
    store: &TensorStore,
    cfg: &ModelConfig,
    mix: QuantMix,
    threads: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TensorStore, ModelError> {
    let mut tensors = plan_in_place(store)?;
    assign_types(&mut tensors, cfg, mix);
    let total: u64 = tensors.iter().map(Planned::source_bytes).sum();
    let mut done = 0u64;
    let mut out = store.empty_like();
    for t in &tensors {
        let name = &t.parts[0];
        if t.spec.ty == t.source_type {
            out.copy_entry(store, name);
        } else {
            let rows: usize = t.spec.dims.iter().skip(1).product::<u64>() as usize;
            let mut bytes = vec![0u8; t.bytes() as usize];
            quantize_rows(store, t, 0..rows, threads, &mut bytes)?;
            let dims: Vec<usize> = t.spec.dims.iter().map(|&d| d as usize).collect();
            out.insert_owned(name, t.spec.ty, dims, bytes);
            store.release(name);
        }
        done += t.source_bytes();
        progress(done, total);
    }
    Ok(out)
}

/// What `--quantize` makes of a folder's tensors: (name, type, bytes) of each.
pub fn quantized_tensors(
    store: &TensorStore,
    cfg: &ModelConfig,
    mix: QuantMix,
) -> Result<Vec<(String, GgmlType, u64)>, ModelError> {
    let mut tensors = plan_in_place(store)?;
    assign_types(&mut tensors, cfg, mix);
    Ok(tensors
        .iter()
        .map(|t| (t.spec.name.clone(), t.spec.ty, t.bytes()))
        .collect())
}

/// A folder's tensors as they are (per-expert tensors stay apart, no reordering of rows), in
/// the order [`plan`] writes them, so both paths count attention-v tensors alike.
fn plan_in_place(store: &TensorStore) -> Result<Vec<Planned>, ModelError> {
    let mut v = Vec::new();
    for (name, ty, _) in store.list() {
        let (_, dims, _) = store
            .raw(&name)
            .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
        v.push(Planned::as_stored(
            &name,
            ty,
            dims.iter().map(|&d| d as u64).collect(),
        ));
    }
    refuse_quantized(&v)?;
    llama_order(&mut v);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rows_go_from_rotate_half_to_interleaved() {
        // one head of 8 rows: output rows (0,1,2,3,4,5,6,7) come from (0,4,1,5,2,6,3,7)
        let got: Vec<usize> = (0..8).map(|r| source_row(r, 8, Some(1))).collect();
        assert_eq!(got, [0, 4, 1, 5, 2, 6, 3, 7]);
        // two heads keep to themselves
        let got: Vec<usize> = (8..16).map(|r| source_row(r, 16, Some(2))).collect();
        assert_eq!(got, [8, 12, 9, 13, 10, 14, 11, 15]);
        assert_eq!(source_row(5, 16, None), 5);
    }

    #[test]
    fn expert_parts_are_recognized() {
        assert_eq!(
            expert_part("blk.3.ffn_up_exps.7.weight"),
            Some(("blk.3.ffn_up_exps".into(), 7))
        );
        assert_eq!(expert_part("blk.3.ffn_up.weight"), None);
        assert_eq!(expert_part("blk.3.ffn_up_exps.weight"), None);
    }
}
