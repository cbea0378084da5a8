//! Parsing of the GGUF header: everything before the tensor data.

use crate::{GgmlType, GgufError, Value, ValueType};
use std::collections::HashMap;

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Nested arrays deeper than this are refused (no real file nests more than twice).
const MAX_ARRAY_DEPTH: u32 = 8;

/// One tensor's entry in the index. `offset` is relative to the start of the data section.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub offset: u64,
    /// Bytes of data, from type and shape.
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The parsed header of a GGUF file.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl Header {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// `general.architecture`, the prefix of the hyper-parameter keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    /// Sum of every tensor's size from its type and shape.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

/// A bounds-checked little-endian cursor over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| GgufError::Invalid {
            what: what.to_string(),
            offset: at,
            reason: format!("string is not UTF-8 ({e})"),
        })
    }

    /// Reads a count and checks that `count` items of at least `min_size` bytes can still fit.
    fn count(&mut self, min_size: u64, what: &str) -> Result<u64, GgufError> {
        let at = self.pos as u64;
        let n = self.u64(what)?;
        if n.saturating_mul(min_size) > self.remaining() {
            return Err(GgufError::Invalid {
                what: what.to_string(),
                offset: at,
                reason: format!(
                    "count {n} cannot fit in the {} bytes left in the file (file truncated or count corrupt)",
                    self.remaining()
                ),
            });
        }
        Ok(n)
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(key)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(key)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(key)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(key)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Bool => {
                let at = self.pos as u64;
                match self.array::<1>(key)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(GgufError::Invalid {
                            what: format!("metadata '{key}'"),
                            offset: at,
                            reason: format!("bool byte is {b}, expected 0 or 1"),
                        })
                    }
                }
            }
            ValueType::String => Value::String(self.string(key)?),
            ValueType::Array => {
                let at = self.pos as u64;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Invalid {
                        what: format!("metadata '{key}'"),
                        offset: at,
                        reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let elem = self.value_type(key)?;
                let n = self.count(elem.min_size(), &format!("metadata '{key}' array length"))?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let at = self.pos as u64;
        let id = self.u32(key)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::Invalid {
            what: format!("metadata '{key}'"),
            offset: at,
            reason: format!("unknown value type {id}"),
        })
    }
}

/// Parse and validate the header of a GGUF file held in `buf` (the whole file).
pub fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    // A tensor info is at least name length + n_dims + type + offset bytes.
    let n_tensors = c.count(8 + 4 + 4 + 8, "tensor count")?;
    // A key/value pair is at least key length + value type + 1 byte.
    let n_kv = c.count(8 + 4 + 1, "metadata count")?;

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.value_type(&key)?;
        let value = c.value(ty, &key, 0)?;
        if index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::BadMetadata {
                key,
                reason: "duplicate key".into(),
            });
        }
        metadata.push((key, value));
    }

    let alignment = match index.get("general.alignment").map(|&i| &metadata[i]) {
        None => DEFAULT_ALIGNMENT,
        Some((key, v)) => match v {
            Value::U32(a) if *a > 0 && a.is_power_of_two() => *a as u64,
            other => {
                return Err(GgufError::BadMetadata {
                    key: key.clone(),
                    reason: format!("alignment must be a power-of-two u32, got {other:?}"),
                })
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor #{i} name"))?;
        let bad = |reason: String| GgufError::BadTensor {
            name: name.clone(),
            reason,
        };
        let n_dims = c.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!(
                "has {n_dims} dimensions (1..={MAX_DIMS} allowed)"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&name)?);
        }
        let type_id = c.u32(&name)?;
        let ggml_type =
            GgmlType::from_id(type_id).ok_or_else(|| bad(format!("unknown type id {type_id}")))?;
        let offset = c.u64(&name)?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n < (1 << 60))
            .ok_or_else(|| bad(format!("dimension product of {dims:?} overflows")))?;
        if dims.contains(&0) {
            return Err(bad(format!("has a zero dimension {dims:?}")));
        }
        if dims[0] % ggml_type.block_len() != 0 {
            return Err(bad(format!(
                "row length {} is not a multiple of the {} block length {}",
                dims[0],
                ggml_type,
                ggml_type.block_len()
            )));
        }
        let n_bytes = ggml_type
            .bytes_for(n_elements)
            .ok_or_else(|| bad("size overflows".into()))?;
        if offset % alignment != 0 {
            return Err(bad(format!(
                "data offset {offset} is not aligned to {alignment}"
            )));
        }
        if tensor_index.insert(name.clone(), tensors.len()).is_some() {
            return Err(bad("duplicate tensor name".into()));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        });
    }

    // The data section starts at the next multiple of the alignment.
    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    if n_tensors > 0 && data_offset > file_len {
        return Err(GgufError::Truncated {
            what: "data section".into(),
            offset: header_end,
            needed: data_offset - header_end,
            len: file_len,
        });
    }
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                reason: format!(
                    "data [{}, +{}) lies past the end of the data section ({} bytes; file truncated or offset corrupt)",
                    t.offset, t.n_bytes, data_len
                ),
            });
        }
    }
    // Tensors may not overlap one another.
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .map(|t| (t.offset, t.offset + t.n_bytes, t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::BadTensor {
                name: w[1].2.to_string(),
                reason: format!("data overlaps tensor '{}'", w[0].2),
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        index,
        tensor_index,
    })
}
