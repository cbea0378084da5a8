//! What can go wrong on the way to and on the GPU, as one-line messages.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    /// No usable driver, device or library: the line a user sees for `--device cuda` on a
    /// machine without a GPU.
    #[error("no CUDA device found: {0}")]
    NoDevice(String),
    #[error("CUDA library {lib} could not be loaded ({reason}); install the CUDA 13 runtime or use --device cpu")]
    MissingLibrary { lib: String, reason: String },
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile { arch: String, log: String },
    #[error("the CUDA backend does not support {0}")]
    Unsupported(String),
    #[error("GPU memory plan: {0}")]
    Plan(String),
    #[error(transparent)]
    Model(#[from] kestrel_models::ModelError),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, CudaError>;
