//! The AMD backend, through amdsmi (`libamd_smi.so`), loaded at run time.

pub mod ffi;
