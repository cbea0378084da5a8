//! GGUF reader and writer ([`writer`]).
//!
//! Shaped like the spec: [`header`] parses magic, version, metadata and tensor infos from a byte
//! slice (cheap, testable, fuzzable, no I/O); [`GgufFile`] memory-maps a file and hands out tensor
//! bytes as borrowed slices, so loading never copies the weights. Every count, offset, size and
//! dimension product is checked against the file length before use: no input makes it panic.

mod error;
mod header;
mod types;
mod value;
pub mod writer;

pub use error::GgufError;
pub use header::{parse, Header, TensorInfo};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use writer::{write_gguf, TensorSpec};

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A GGUF file mapped into memory, with its parsed and validated header.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    pub header: Header,
}

impl GgufFile {
    /// Map `path` and parse its header. The tensor data stays on disk until touched.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::File::open(&path).map_err(|source| GgufError::Io {
            path: path.clone(),
            source,
        })?;
        // SAFETY: the map is read-only; a file truncated by another process while mapped would
        // fault, which is the same contract every mmap-based loader (llama.cpp, candle) accepts.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| GgufError::Io {
            path: path.clone(),
            source,
        })?;
        let header = parse(&map)?;
        Ok(Self {
            path,
            map: Arc::new(map),
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// The shared memory map, for holders of tensor views that outlive this struct.
    pub fn mmap(&self) -> &Arc<memmap2::Mmap> {
        &self.map
    }

    /// Absolute file offset of a tensor's data.
    pub fn tensor_file_offset(&self, info: &TensorInfo) -> u64 {
        self.header.data_offset + info.offset
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The bytes of one tensor (validated at parse time to lie inside the file).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.map[start..start + info.n_bytes as usize]
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// Hint the kernel that the tensor data will be read soon (best effort).
    pub fn advise_willneed(&self) {
        let _ = self.map.advise(memmap2::Advice::WillNeed);
    }
}
