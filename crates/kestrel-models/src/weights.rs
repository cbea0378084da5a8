//! Typed views of weight tensors, borrowed from a memory map (GGUF, safetensors): no copy at load.
//!
//! Every tensor is addressed by its GGUF name (`blk.3.attn_q.weight`); Hugging Face names are
//! mapped onto those, so recipes see one naming scheme whatever the file format.

use crate::ModelError;
use kestrel_gguf::{GgmlType, GgufFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A 2-D weight matrix `[rows, cols]` (row-major; each row is `cols` elements in `ty` blocks).
pub struct Weight {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    map: Backing,
    start: usize,
    /// Rows repacked for the SIMD kernels ([`Weight::repack`]); once there, every reader
    /// (kernels, reference path, row lookups) takes the rows from it.
    packed: Option<kestrel_quant::repack::Repacked>,
}

const PAGE: usize = 4096;

/// Where a tensor's bytes live: a read-only file mapping, or memory (quantized at load).
#[derive(Clone)]
pub enum Backing {
    Map(Arc<memmap2::Mmap>),
    Owned(Arc<Vec<u8>>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

impl Backing {
    /// Gives the pages of `from..from + len` back to the OS (mapped files only; page-aligned).
    fn release_range(&self, from: usize, len: usize) {
        if let Backing::Map(map) = self {
            // SAFETY: a read-only private file mapping: dropped pages are re-read from the
            // file on the next access, so no reader can observe a change.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, len)
            };
        }
    }
}

/// Whether [`Weight::repack`] would repack a matrix of this type and shape here.
pub fn repacks(ty: GgmlType, rows: usize) -> bool {
    kestrel_quant::repack::Repacked::supports(ty, rows)
}

/// Extra resident bytes of the load-time repacking, for the memory plan (each repacked group
/// starts on a cache line; the mapped pages are released). `tensors`: (name, type, rows,
/// cols) of every matrix; the token embedding counts only where it is also the output.
pub fn repack_extra_bytes<'a>(
    tensors: impl Iterator<Item = (&'a str, GgmlType, usize, usize)> + Clone,
) -> u64 {
    let tied = !tensors.clone().any(|(name, ..)| name == "output.weight");
    tensors
        .filter(|(name, ty, rows, _)| repacks(*ty, *rows) && (tied || *name != "token_embd.weight"))
        .map(|(_, ty, rows, cols)| kestrel_quant::repack::Repacked::extra_bytes(ty, rows, cols))
        .sum()
}

impl Weight {
    /// Repacks a Q4_K / Q5_K / Q6_K / Q8_0 / Q5_x / Q4_x matrix for the AVX-512 kernels (the
    /// K-quants for the AVX2 ones too) when [`repacks`] says so and releases its mapped pages as it goes; rows are read back from the repacked
    /// copy ([`Weight::row_f32`]), so nothing faults them in again.
    pub fn repack(&mut self) -> Result<bool, ModelError> {
        if self.packed.is_some() || !repacks(self.ty, self.rows) {
            return Ok(false);
        }
        // Source pages are released as their rows are repacked, so a large matrix (a tied
        // output) never sits in memory twice.
        let (map, start, row_bytes) = (self.map.clone(), self.start, self.row_bytes);
        let mut released = start;
        let mut release = |rows_done: usize| {
            let upto = (start + rows_done * row_bytes) / PAGE * PAGE;
            let from = released.next_multiple_of(PAGE);
            if upto > from {
                map.release_range(from, upto - from);
                released = upto;
            }
        };
        let packed = kestrel_quant::repack::Repacked::new_with(
            self.ty,
            self.bytes(),
            self.rows,
            self.cols,
            &mut release,
        )?;
        release(self.rows);
        self.packed = Some(packed);
        Ok(true)
    }

    /// The repacked form, if [`Weight::repack`] made one.
    pub fn packed(&self) -> Option<&kestrel_quant::repack::Repacked> {
        self.packed.as_ref()
    }

    /// All rows, contiguous.
    /// Drops the resident pages of a mapped matrix that is only read a few rows at a time (an
    /// embedding that is not also the output head): rows fault back in from the file as they
    /// are looked up. Pages shared with a neighbouring tensor are kept.
    pub fn release_pages(&self) {
        let (from, upto) = (
            self.start.next_multiple_of(PAGE),
            (self.start + self.rows * self.row_bytes) / PAGE * PAGE,
        );
        if upto > from {
            self.map.release_range(from, upto - from);
        }
    }

    /// This matrix converted to `ty` (dequantized row by row, then quantized), held in memory
    /// under `name`: a draft model's matrices in fewer bits (`LoadOptions::draft_type`).
    pub fn requantized(&self, ty: GgmlType, name: &str) -> Result<Weight, ModelError> {
        let row_bytes = ty.bytes_for(self.cols as u64).unwrap_or(0) as usize;
        if row_bytes == 0 || !cpu_supports(ty) {
            return Err(ModelError::Unsupported(format!(
                "{} cannot be held as {ty}: its rows of {} do not divide into {ty} blocks",
                self.name, self.cols
            )));
        }
        let mut bytes = vec![0u8; self.rows * row_bytes];
        let mut row = vec![0f32; self.cols];
        for (r, dst) in bytes.chunks_exact_mut(row_bytes).enumerate() {
            self.row_f32(r, &mut row)?;
            kestrel_quant::quantize_row(ty, &row, dst)?;
        }
        Ok(Weight {
            name: name.to_string(),
            ty,
            rows: self.rows,
            cols: self.cols,
            row_bytes,
            map: Backing::Owned(Arc::new(bytes)),
            start: 0,
            packed: None,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.rows * self.row_bytes]
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The encoded bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let s = self.start + r * self.row_bytes;
        &self.map[s..s + self.row_bytes]
    }

    /// Row `r` decoded to f32.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        if let Some(packed) = &self.packed {
            // From the repacked copy: the file's pages of a repacked matrix stay released.
            let mut native = vec![0u8; self.row_bytes];
            packed.native_row(r, &mut native)?;
            kestrel_quant::dequantize_row(self.ty, &native, &mut out[..self.cols])?;
            return Ok(());
        }
        kestrel_quant::dequantize_row(self.ty, self.row(r), &mut out[..self.cols])?;
        Ok(())
    }

    /// The whole tensor decoded to f32 (for small vectors: norms, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            self.row_f32(r, &mut out[r * self.cols..(r + 1) * self.cols])?;
        }
        Ok(out)
    }
}

/// One entry of the tensor index: where the bytes are and what they hold.
struct Entry {
    ty: GgmlType,
    /// Shape in ggml order (dims[0] is the row length).
    dims: Vec<usize>,
    map: Backing,
    start: usize,
    len: usize,
}

/// Where a store's tensors come from; recipes need it where the two formats store a tensor
/// differently (Qwen3.5's norms as `1 + w`, its `A_log`, its value-head order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFormat {
    Gguf,
    HuggingFace,
}

/// All tensors of a model file (or folder of files), by GGUF name.
pub struct TensorStore {
    pub path: PathBuf,
    pub format: StoreFormat,
    entries: HashMap<String, Entry>,
}

impl TensorStore {
    pub fn from_gguf(file: &GgufFile) -> Self {
        let entries = file
            .header
            .tensors
            .iter()
            .map(|t| {
                let entry = Entry {
                    ty: t.ggml_type,
                    dims: t.dims.iter().map(|&d| d as usize).collect(),
                    map: Backing::Map(file.mmap().clone()),
                    start: file.tensor_file_offset(t) as usize,
                    len: t.n_bytes as usize,
                };
                (t.name.clone(), entry)
            })
            .collect();
        Self {
            path: file.path().to_path_buf(),
            format: StoreFormat::Gguf,
            entries,
        }
    }

    /// Every `*.safetensors` file of a Hugging Face folder.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, ModelError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| ModelError::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .filter(|p| p.file_name().is_some_and(|n| n != "reference.safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::BadFile {
                path: dir.to_path_buf(),
                reason: "no *.safetensors files in the folder".into(),
            });
        }
        let mut entries = HashMap::new();
        for path in files {
            let bad = |reason: String| ModelError::BadFile {
                path: path.clone(),
                reason,
            };
            let file = std::fs::File::open(&path).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: read-only map of a model file (see kestrel_gguf::GgufFile::open).
            let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|source| {
                ModelError::Io {
                    path: path.clone(),
                    source,
                }
            })?);
            let st = safetensors::SafeTensors::deserialize(&map)
                .map_err(|e| bad(format!("invalid safetensors: {e}")))?;
            for (name, view) in st.tensors() {
                let ty = match view.dtype() {
                    safetensors::Dtype::F32 => GgmlType::F32,
                    safetensors::Dtype::F16 => GgmlType::F16,
                    safetensors::Dtype::BF16 => GgmlType::BF16,
                    other => {
                        return Err(bad(format!(
                            "tensor '{name}' has unsupported dtype {other:?}"
                        )))
                    }
                };
                let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
                // safetensors shapes are outermost-first; ggml order is innermost-first.
                let dims: Vec<usize> = view.shape().iter().rev().copied().collect();
                let entry = Entry {
                    ty,
                    dims,
                    map: Backing::Map(map.clone()),
                    start,
                    len: view.data().len(),
                };
                entries.insert(hf_to_gguf_name(&name), entry);
            }
        }
        Ok(Self {
            path: dir.to_path_buf(),
            format: StoreFormat::HuggingFace,
            entries,
        })
    }

    /// A tensor's type, ggml dims and bytes as stored (for converters).
    pub fn raw(&self, name: &str) -> Option<(GgmlType, &[usize], &[u8])> {
        let e = self.entries.get(name)?;
        Some((e.ty, &e.dims, &e.map[e.start..e.start + e.len]))
    }

    /// Releases the mapped pages of a tensor already read (a converter streaming a model
    /// through memory keeps only what it is writing).
    pub fn release(&self, name: &str) {
        if let Some(e) = self.entries.get(name) {
            let from = e.start.next_multiple_of(PAGE);
            let upto = (e.start + e.len) / PAGE * PAGE;
            if upto > from {
                e.map.release_range(from, upto - from);
            }
        }
    }

    /// A store with no tensors, of the same path and format (to fill with [`Self::copy_entry`]
    /// and [`Self::insert_owned`]).
    pub fn empty_like(&self) -> Self {
        Self {
            path: self.path.clone(),
            format: self.format,
            entries: HashMap::new(),
        }
    }

    /// Takes tensor `name` of `other` as it is (still mapped).
    pub fn copy_entry(&mut self, other: &TensorStore, name: &str) {
        if let Some(e) = other.entries.get(name) {
            let entry = Entry {
                ty: e.ty,
                dims: e.dims.clone(),
                map: e.map.clone(),
                start: e.start,
                len: e.len,
            };
            self.entries.insert(name.to_string(), entry);
        }
    }

    /// Adds tensor `name` held in memory (`bytes` of type `ty`, ggml dims `dims`).
    pub fn insert_owned(&mut self, name: &str, ty: GgmlType, dims: Vec<usize>, bytes: Vec<u8>) {
        let len = bytes.len();
        let entry = Entry {
            ty,
            dims,
            map: Backing::Owned(Arc::new(bytes)),
            start: 0,
            len,
        };
        self.entries.insert(name.to_string(), entry);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// (name, type, bytes) of every tensor, sorted by name.
    pub fn list(&self) -> Vec<(String, GgmlType, u64)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .map(|(n, e)| (n.clone(), e.ty, e.len as u64))
            .collect();
        v.sort();
        v
    }

    /// Total bytes of all tensors.
    pub fn total_bytes(&self) -> u64 {
        self.entries.values().map(|e| e.len as u64).sum()
    }

    /// A matrix of `rows` rows of `cols` elements.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, ModelError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let found_rows: usize = e.dims.iter().skip(1).product();
        if e.dims.first() != Some(&cols) || found_rows != rows {
            return Err(ModelError::BadShape {
                name: name.to_string(),
                expected: vec![cols, rows],
                found: e.dims.clone(),
            });
        }
        if !cpu_supports(e.ty) {
            return Err(ModelError::BadType {
                name: name.to_string(),
                ty: e.ty.to_string(),
            });
        }
        let row_bytes = e.ty.bytes_for(cols as u64).unwrap_or(0) as usize;
        debug_assert_eq!(row_bytes * rows, e.len);
        Ok(Weight {
            name: name.to_string(),
            ty: e.ty,
            rows,
            cols,
            row_bytes,
            map: e.map.clone(),
            start: e.start,
            packed: None,
        })
    }

    /// The `n` experts of a mixture-of-experts weight, each a `[rows, cols]` matrix: views into
    /// GGUF's one 3-D tensor `{stem}.weight` (ggml dims `[cols, rows, n]`), or Hugging Face's
    /// one tensor per expert (mapped to `{stem}.{e}.weight`).
    pub fn experts(
        &self,
        stem: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Weight>, ModelError> {
        let name = format!("{stem}.weight");
        let Some(e) = self.entries.get(&name) else {
            return (0..n)
                .map(|i| self.matrix(&format!("{stem}.{i}.weight"), rows, cols))
                .collect();
        };
        if e.dims != [cols, rows, n] {
            return Err(ModelError::BadShape {
                name,
                expected: vec![cols, rows, n],
                found: e.dims.clone(),
            });
        }
        if !cpu_supports(e.ty) {
            return Err(ModelError::BadType {
                name,
                ty: e.ty.to_string(),
            });
        }
        let row_bytes = e.ty.bytes_for(cols as u64).unwrap_or(0) as usize;
        Ok((0..n)
            .map(|i| Weight {
                name: format!("{stem}.{i}"),
                ty: e.ty,
                rows,
                cols,
                row_bytes,
                map: e.map.clone(),
                start: e.start + i * rows * row_bytes,
                packed: None,
            })
            .collect())
    }

    /// A vector of `len` elements decoded to f32 (norm weights, biases).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        self.matrix(name, 1, len)?.to_f32()
    }

    pub fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if self.contains(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Touch every page of the tensor data so the first forward pass does not stall on page
    /// faults; `progress(done, total)` is called as bytes are touched.
    pub fn prefault(&self, skip: &[&str], progress: &mut dyn FnMut(u64, u64)) {
        let total = self.total_bytes();
        let mut done = 0u64;
        let mut sink = 0u8;
        for (name, e) in &self.entries {
            if skip.contains(&name.as_str()) {
                done += e.len as u64;
                continue;
            }
            let bytes = &e.map[e.start..e.start + e.len];
            for chunk in bytes.chunks(1 << 22) {
                for page in chunk.iter().step_by(4096) {
                    sink ^= *page;
                }
                done += chunk.len() as u64;
                progress(done, total);
            }
        }
        std::hint::black_box(sink);
    }
}

/// Maps Hugging Face parameter names onto GGUF names; unknown names pass through unchanged.
/// Qwen3.5's `A_log` becomes `ssm_a_log` (GGUF stores `-exp(A_log)` as `ssm_a`).
fn hf_to_gguf_name(hf: &str) -> String {
    // Multimodal checkpoints nest the language model one level down.
    let owned;
    let hf = match hf.strip_prefix("model.language_model.") {
        Some(rest) => {
            owned = format!("model.{rest}");
            owned.as_str()
        }
        None => hf,
    };
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let Some(rest) = hf.strip_prefix("model.layers.") else {
        return hf.to_string();
    };
    let Some((layer, param)) = rest.split_once('.') else {
        return hf.to_string();
    };
    let mapped = match param {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        // Qwen3-MoE's router
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        // Qwen3.5's gated DeltaNet
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.A_log" => "ssm_a_log",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        _ => {
            return expert_name(param)
                .map_or_else(|| hf.to_string(), |e| format!("blk.{layer}.{e}"))
        }
    };
    format!("blk.{layer}.{mapped}")
}

/// `mlp.experts.7.gate_proj.weight` -> `ffn_gate_exps.7.weight` (see [`TensorStore::experts`]).
fn expert_name(param: &str) -> Option<String> {
    let rest = param.strip_prefix("mlp.experts.")?;
    let (e, proj) = rest.split_once('.')?;
    let e: usize = e.parse().ok()?;
    let stem = match proj {
        "gate_proj.weight" => "ffn_gate_exps",
        "up_proj.weight" => "ffn_up_exps",
        "down_proj.weight" => "ffn_down_exps",
        _ => return None,
    };
    Some(format!("{stem}.{e}.weight"))
}

/// Weight types the CPU kernels can multiply.
fn cpu_supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

#[cfg(test)]
mod tests {
    use super::{hf_to_gguf_name, Backing, Weight};
    use kestrel_gguf::GgmlType;
    use std::sync::Arc;

    /// An f32 matrix held in memory.
    fn f32_matrix(rows: usize, cols: usize, f: impl Fn(usize) -> f32) -> Weight {
        let bytes: Vec<u8> = (0..rows * cols).flat_map(|i| f(i).to_le_bytes()).collect();
        Weight {
            name: "m".into(),
            ty: GgmlType::F32,
            rows,
            cols,
            row_bytes: cols * 4,
            map: Backing::Owned(Arc::new(bytes)),
            start: 0,
            packed: None,
        }
    }

    #[test]
    fn requantized_rows_stay_within_the_types_error() {
        let (rows, cols) = (48, 96);
        let value = |i: usize| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 5) as f32);
        let m = f32_matrix(rows, cols, value);
        // (type, bytes a 32-block, largest error: a step of max |x| (<= 5 here) / 2^(bits-1))
        for (ty, block, step) in [
            (GgmlType::Q5_0, 22, 5.0 / 16.0),
            (GgmlType::Q4_0, 18, 5.0 / 8.0),
        ] {
            let q = m.requantized(ty, "m (copy)").unwrap();
            assert_eq!(
                (q.ty, q.rows, q.cols, q.name.as_str()),
                (ty, rows, cols, "m (copy)")
            );
            assert_eq!(q.bytes().len(), rows * cols / 32 * block);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                q.row_f32(r, &mut row).unwrap();
                for (c, &got) in row.iter().enumerate() {
                    let want = value(r * cols + c);
                    assert!(
                        (got - want).abs() <= step,
                        "{ty} row {r} col {c}: {got} vs {want}"
                    );
                }
            }
        }
        // 33 columns do not divide into 32-blocks: a clear error, not a panic
        let odd = f32_matrix(2, 33, |_| 1.0);
        let e = match odd.requantized(GgmlType::Q5_0, "odd") {
            Ok(_) => panic!("33 columns held as Q5_0"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("do not divide"), "{e}");
    }

    #[test]
    fn hf_names_map_to_gguf_names() {
        assert_eq!(
            hf_to_gguf_name("model.layers.3.self_attn.q_proj.bias"),
            "blk.3.attn_q.bias"
        );
        assert_eq!(
            hf_to_gguf_name("model.layers.0.mlp.down_proj.weight"),
            "blk.0.ffn_down.weight"
        );
        assert_eq!(hf_to_gguf_name("lm_head.weight"), "output.weight");
        assert_eq!(
            hf_to_gguf_name("model.language_model.layers.2.linear_attn.A_log"),
            "blk.2.ssm_a_log"
        );
        assert_eq!(
            hf_to_gguf_name("model.layers.1.mlp.experts.7.up_proj.weight"),
            "blk.1.ffn_up_exps.7.weight"
        );
        assert_eq!(
            hf_to_gguf_name("model.layers.1.mlp.gate.weight"),
            "blk.1.ffn_gate_inp.weight"
        );
        assert_eq!(hf_to_gguf_name("something.else"), "something.else");
    }
}
