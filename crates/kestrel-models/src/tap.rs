//! Parity taps: with `KESTREL_TAP_DIR` set, a forward pass writes named intermediate tensors
//! there as raw little-endian f32 (`{name}-{layer}.f32`, row-major `[T, width]`), named as
//! llama.cpp's graph names them, so a divergence from another engine can be traced to the first
//! operation that differs (see docs/parity.md). Off by default: one relaxed check per call.

use std::path::PathBuf;
use std::sync::OnceLock;

fn dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("KESTREL_TAP_DIR").map(PathBuf::from))
        .as_ref()
}

/// Writes `x` as `{name}-{layer}.f32` when tapping is on; failures are reported, not fatal.
pub fn tap(name: &str, layer: usize, x: &[f32]) {
    let Some(dir) = dir() else { return };
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = dir.join(format!("{name}-{layer}.f32"));
    if let Err(e) = std::fs::write(&path, bytes) {
        eprintln!("kestrel: cannot write tap {}: {e}", path.display());
    }
}
