//! Small shared pieces: the cost metric and a numpy-compatible random generator.

pub mod metric;
pub mod numpy_rng;
pub mod private_dir;
