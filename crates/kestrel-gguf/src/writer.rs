//! GGUF writer (version 3): metadata, the tensor table, then each tensor's bytes at its
//! aligned offset. The table is written before any data, so every tensor's type and shape are
//! declared up front and the data streams in afterwards, one tensor at a time (a quantizer
//! never holds the whole model).

use crate::{GgmlType, GgufError, Value};
use std::io::Write;
use std::path::Path;

/// One tensor to be written: name, type and shape in ggml order (`dims[0]` = row length).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorSpec {
    /// Bytes of data from type and shape (None when the rows do not fill whole blocks).
    pub fn n_bytes(&self) -> Option<u64> {
        let rows: u64 = self.dims.iter().skip(1).product();
        self.ty
            .bytes_for(*self.dims.first()?)
            .and_then(|r| r.checked_mul(rows))
    }
}

/// Default alignment of the data section and of every tensor in it.
pub const ALIGNMENT: u64 = 32;

/// Writes `path`: `metadata` in order, `tensors` in order, and for each tensor the bytes that
/// `data(i, out)` writes (exactly [`TensorSpec::n_bytes`] of them, checked).
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    mut data: impl FnMut(usize, &mut dyn Write) -> Result<(), GgufError>,
) -> Result<(), GgufError> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = CountingWriter {
        inner: std::io::BufWriter::with_capacity(1 << 20, file),
        written: 0,
    };
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        sizes.push(t.n_bytes().ok_or_else(|| GgufError::BadTensor {
            name: t.name.clone(),
            reason: format!(
                "shape {:?} does not fill whole {} blocks",
                t.dims,
                t.ty.name()
            ),
        })?);
    }
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut head, key);
        head.extend_from_slice(&value_type_id(value).to_le_bytes());
        put_value(&mut head, value);
    }
    let mut offset = 0u64;
    for (t, &size) in tensors.iter().zip(&sizes) {
        put_str(&mut head, &t.name);
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ty.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + size).next_multiple_of(ALIGNMENT);
    }
    out.write_all(&head).map_err(io)?;
    out.pad_to(ALIGNMENT).map_err(io)?;
    for (i, (t, &size)) in tensors.iter().zip(&sizes).enumerate() {
        let start = out.written;
        data(i, &mut out)?;
        let wrote = out.written - start;
        if wrote != size {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                reason: format!("wrote {wrote} bytes of data, its type and shape need {size}"),
            });
        }
        out.pad_to(ALIGNMENT).map_err(io)?;
    }
    out.inner.flush().map_err(io)?;
    Ok(())
}

struct CountingWriter<W: Write> {
    inner: W,
    written: u64,
}

impl<W: Write> CountingWriter<W> {
    fn pad_to(&mut self, align: u64) -> std::io::Result<()> {
        let pad = self.written.next_multiple_of(align) - self.written;
        self.write_all(&vec![0u8; pad as usize])
    }
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // an empty array is written as an array of u8
            let ty = items.first().map_or(0, value_type_id);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufFile;

    #[test]
    fn written_files_read_back() {
        let dir = std::env::temp_dir().join(format!("kestrel-gguf-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.gguf");
        let metadata = vec![
            (
                "general.architecture".to_string(),
                Value::String("llama".into()),
            ),
            ("llama.block_count".to_string(), Value::U32(2)),
            (
                "tokenizer.ggml.tokens".to_string(),
                Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
            ),
            ("x.f".to_string(), Value::F32(1.5)),
        ];
        let tensors = vec![
            TensorSpec {
                name: "a".into(),
                ty: GgmlType::F32,
                dims: vec![3],
            },
            TensorSpec {
                name: "b".into(),
                ty: GgmlType::Q8_0,
                dims: vec![32, 2],
            },
        ];
        write_gguf(&path, &metadata, &tensors, |i, out| {
            let bytes = vec![i as u8 + 1; tensors[i].n_bytes().unwrap() as usize];
            out.write_all(&bytes).map_err(|source| GgufError::Io {
                path: "mem".into(),
                source,
            })
        })
        .unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.header.metadata, metadata);
        let b = f.tensor("b").unwrap();
        assert_eq!((b.dims.clone(), b.ggml_type), (vec![32, 2], GgmlType::Q8_0));
        assert!(f.tensor_data(b).iter().all(|&x| x == 2));
        assert_eq!(f.tensor_data(f.tensor("a").unwrap()), &[1u8; 12]);

        // a data callback that writes the wrong length is an error, not a corrupt file
        let short = write_gguf(&path, &metadata, &tensors, |_, out| {
            out.write_all(&[0u8; 4]).map_err(|source| GgufError::Io {
                path: "mem".into(),
                source,
            })
        });
        assert!(matches!(short, Err(GgufError::BadTensor { .. })));
        std::fs::remove_dir_all(&dir).ok();
    }
}
