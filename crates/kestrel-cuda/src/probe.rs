//! Finds the CUDA libraries before cudarc touches them: cudarc loads a library on first use and
//! aborts the process when it is missing (shared/examples/cuda-smoke), so a machine without a
//! GPU must be told so here, as one line, before any CUDA call.

use crate::error::{CudaError, Result};

/// The libraries the backend opens, in the order it needs them, with the names they go by.
const LIBS: &[(&str, &[&str])] = &[
    (
        "libcuda (the NVIDIA driver)",
        &["libcuda.so.1", "libcuda.so"],
    ),
    (
        "libnvrtc (CUDA 13 NVRTC)",
        &["libnvrtc.so.13", "libnvrtc.so"],
    ),
    (
        "libcublas (CUDA 13 cuBLAS)",
        &["libcublas.so.13", "libcublas.so"],
    ),
    (
        "libcublasLt (CUDA 13 cuBLAS)",
        &["libcublasLt.so.13", "libcublasLt.so"],
    ),
];

/// Opens (and closes) every library the backend needs; the first missing one is the error.
/// A missing driver reads as "no CUDA device found".
pub fn libraries() -> Result<()> {
    for (i, (what, names)) in LIBS.iter().enumerate() {
        let mut last = String::new();
        let found = names.iter().any(|n| {
            // SAFETY: loading a system library runs its initializers; these are NVIDIA's
            // own libraries, loaded the same way cudarc would load them.
            match unsafe { libloading::Library::new(n) } {
                Ok(_) => true,
                Err(e) => {
                    last = e.to_string();
                    false
                }
            }
        });
        if !found {
            return Err(if i == 0 {
                CudaError::NoDevice(format!("{what} is not installed ({last})"))
            } else {
                CudaError::MissingLibrary {
                    lib: what.to_string(),
                    reason: last,
                }
            });
        }
    }
    Ok(())
}

/// Number of CUDA devices, after the libraries were found (0 when the driver sees none).
pub fn device_count() -> Result<usize> {
    libraries()?;
    match cudarc::driver::result::init() {
        Ok(()) => {}
        Err(e) => {
            return Err(CudaError::NoDevice(format!(
                "the driver did not start ({e})"
            )))
        }
    }
    let n = cudarc::driver::CudaContext::device_count()
        .map_err(|e| CudaError::NoDevice(e.to_string()))?;
    Ok(n.max(0) as usize)
}

/// Whether NVRTC alone can be loaded (compiling kernels needs no GPU).
pub fn nvrtc() -> Result<()> {
    let (what, names) = LIBS[1];
    for n in names {
        // SAFETY: as in `libraries`.
        if unsafe { libloading::Library::new(n) }.is_ok() {
            return Ok(());
        }
    }
    Err(CudaError::MissingLibrary {
        lib: what.into(),
        reason: "not found on the library path".into(),
    })
}
