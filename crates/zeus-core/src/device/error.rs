//! Typed GPU errors.
//!
//! One variant per error class of the reference (`zeus.device.gpu.ZeusGPU*Error`), so that every
//! NVML return code maps to exactly one variant and the Python layer can raise the class with the
//! reference name. The numeric NVML codes live here too because both the NVML backend (code to
//! error) and the simulated `libnvidia-ml.so.1` (error to code) need the same table.

use thiserror::Error;

/// An error from a GPU device call. Every variant carries a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GpuError {
    #[error("{0}")]
    Init(String),
    #[error("{0}")]
    InvalidArg(String),
    #[error("{0}")]
    NotSupported(String),
    #[error("{0}")]
    NoPermission(String),
    #[error("{0}")]
    AlreadyInitialized(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InsufficientSize(String),
    #[error("{0}")]
    InsufficientPower(String),
    #[error("{0}")]
    DriverNotLoaded(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    IrqIssue(String),
    #[error("{0}")]
    LibraryNotFound(String),
    #[error("{0}")]
    FunctionNotFound(String),
    #[error("{0}")]
    CorruptedInfoRom(String),
    #[error("{0}")]
    GpuLost(String),
    #[error("{0}")]
    ResetRequired(String),
    #[error("{0}")]
    OperatingSystem(String),
    #[error("{0}")]
    LibRmVersionMismatch(String),
    #[error("{0}")]
    Memory(String),
    #[error("{0}")]
    Unknown(String),
}

/// Result alias for device calls.
pub type GpuResult<T> = Result<T, GpuError>;

/// NVML return codes (`nvmlReturn_t`), as in `nvml.h`.
pub mod nvml_code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NO_PERMISSION: u32 = 4;
    pub const ALREADY_INITIALIZED: u32 = 5;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const INSUFFICIENT_POWER: u32 = 8;
    pub const DRIVER_NOT_LOADED: u32 = 9;
    pub const TIMEOUT: u32 = 10;
    pub const IRQ_ISSUE: u32 = 11;
    pub const LIBRARY_NOT_FOUND: u32 = 12;
    pub const FUNCTION_NOT_FOUND: u32 = 13;
    pub const CORRUPTED_INFOROM: u32 = 14;
    pub const GPU_IS_LOST: u32 = 15;
    pub const RESET_REQUIRED: u32 = 16;
    pub const OPERATING_SYSTEM: u32 = 17;
    pub const LIB_RM_VERSION_MISMATCH: u32 = 18;
    pub const IN_USE: u32 = 19;
    pub const MEMORY: u32 = 20;
    pub const NO_DATA: u32 = 21;
    pub const VGPU_ECC_NOT_SUPPORTED: u32 = 22;
    pub const INSUFFICIENT_RESOURCES: u32 = 23;
    pub const FREQ_NOT_SUPPORTED: u32 = 24;
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    pub const DEPRECATED: u32 = 26;
    pub const NOT_READY: u32 = 27;
    pub const GPU_NOT_FOUND: u32 = 28;
    pub const INVALID_STATE: u32 = 29;
    pub const UNKNOWN: u32 = 999;
}

impl GpuError {
    /// The reference's Python class name for this error (`zeus.device.ZeusGPU*Error`).
    pub fn class_name(&self) -> &'static str {
        match self {
            GpuError::Init(_) => "ZeusGPUInitError",
            GpuError::InvalidArg(_) => "ZeusGPUInvalidArgError",
            GpuError::NotSupported(_) => "ZeusGPUNotSupportedError",
            GpuError::NoPermission(_) => "ZeusGPUNoPermissionError",
            GpuError::AlreadyInitialized(_) => "ZeusGPUAlreadyInitializedError",
            GpuError::NotFound(_) => "ZeusGPUNotFoundError",
            GpuError::InsufficientSize(_) => "ZeusGPUInsufficientSizeError",
            GpuError::InsufficientPower(_) => "ZeusGPUInsufficientPowerError",
            GpuError::DriverNotLoaded(_) => "ZeusGPUDriverNotLoadedError",
            GpuError::Timeout(_) => "ZeusGPUTimeoutError",
            GpuError::IrqIssue(_) => "ZeusGPUIRQError",
            GpuError::LibraryNotFound(_) => "ZeusGPULibraryNotFoundError",
            GpuError::FunctionNotFound(_) => "ZeusGPUFunctionNotFoundError",
            GpuError::CorruptedInfoRom(_) => "ZeusGPUCorruptedInfoROMError",
            GpuError::GpuLost(_) => "ZeusGPULostError",
            GpuError::ResetRequired(_) => "ZeusGPUResetRequiredError",
            GpuError::OperatingSystem(_) => "ZeusGPUOperatingSystemError",
            GpuError::LibRmVersionMismatch(_) => "ZeusGPULibRMVersionMismatchError",
            GpuError::Memory(_) => "ZeusGPUMemoryError",
            GpuError::Unknown(_) => "ZeusGPUUnknownError",
        }
    }

    /// The message without the class.
    pub fn message(&self) -> &str {
        match self {
            GpuError::Init(m)
            | GpuError::InvalidArg(m)
            | GpuError::NotSupported(m)
            | GpuError::NoPermission(m)
            | GpuError::AlreadyInitialized(m)
            | GpuError::NotFound(m)
            | GpuError::InsufficientSize(m)
            | GpuError::InsufficientPower(m)
            | GpuError::DriverNotLoaded(m)
            | GpuError::Timeout(m)
            | GpuError::IrqIssue(m)
            | GpuError::LibraryNotFound(m)
            | GpuError::FunctionNotFound(m)
            | GpuError::CorruptedInfoRom(m)
            | GpuError::GpuLost(m)
            | GpuError::ResetRequired(m)
            | GpuError::OperatingSystem(m)
            | GpuError::LibRmVersionMismatch(m)
            | GpuError::Memory(m)
            | GpuError::Unknown(m) => m,
        }
    }

    /// The same kind of error with another message (to say which device, or what was going
    /// on when it happened).
    pub fn with_message(&self, message: String) -> GpuError {
        use GpuError::*;
        match self {
            Init(_) => Init(message),
            InvalidArg(_) => InvalidArg(message),
            NotSupported(_) => NotSupported(message),
            NoPermission(_) => NoPermission(message),
            AlreadyInitialized(_) => AlreadyInitialized(message),
            NotFound(_) => NotFound(message),
            InsufficientSize(_) => InsufficientSize(message),
            InsufficientPower(_) => InsufficientPower(message),
            DriverNotLoaded(_) => DriverNotLoaded(message),
            Timeout(_) => Timeout(message),
            IrqIssue(_) => IrqIssue(message),
            LibraryNotFound(_) => LibraryNotFound(message),
            FunctionNotFound(_) => FunctionNotFound(message),
            CorruptedInfoRom(_) => CorruptedInfoRom(message),
            GpuLost(_) => GpuLost(message),
            ResetRequired(_) => ResetRequired(message),
            OperatingSystem(_) => OperatingSystem(message),
            LibRmVersionMismatch(_) => LibRmVersionMismatch(message),
            Memory(_) => Memory(message),
            Unknown(_) => Unknown(message),
        }
    }

    /// Map an NVML return code to an error. Codes without a reference class of their own (for
    /// example `NVML_ERROR_IN_USE`) become [`GpuError::Unknown`] with the code in the message.
    pub fn from_nvml_code(code: u32, context: &str) -> GpuError {
        use nvml_code::*;
        let msg = format!("{context}: {}", nvml_error_string(code));
        match code {
            UNINITIALIZED => GpuError::Init(msg),
            INVALID_ARGUMENT => GpuError::InvalidArg(msg),
            NOT_SUPPORTED => GpuError::NotSupported(msg),
            NO_PERMISSION => GpuError::NoPermission(msg),
            ALREADY_INITIALIZED => GpuError::AlreadyInitialized(msg),
            NOT_FOUND | GPU_NOT_FOUND => GpuError::NotFound(msg),
            INSUFFICIENT_SIZE => GpuError::InsufficientSize(msg),
            INSUFFICIENT_POWER => GpuError::InsufficientPower(msg),
            DRIVER_NOT_LOADED => GpuError::DriverNotLoaded(msg),
            TIMEOUT => GpuError::Timeout(msg),
            IRQ_ISSUE => GpuError::IrqIssue(msg),
            LIBRARY_NOT_FOUND => GpuError::LibraryNotFound(msg),
            FUNCTION_NOT_FOUND => GpuError::FunctionNotFound(msg),
            CORRUPTED_INFOROM => GpuError::CorruptedInfoRom(msg),
            GPU_IS_LOST => GpuError::GpuLost(msg),
            RESET_REQUIRED => GpuError::ResetRequired(msg),
            OPERATING_SYSTEM => GpuError::OperatingSystem(msg),
            LIB_RM_VERSION_MISMATCH => GpuError::LibRmVersionMismatch(msg),
            MEMORY => GpuError::Memory(msg),
            _ => GpuError::Unknown(msg),
        }
    }

    /// The NVML return code that stands for this error (used by the simulated NVML library).
    pub fn nvml_code(&self) -> u32 {
        use nvml_code::*;
        match self {
            GpuError::Init(_) => UNINITIALIZED,
            GpuError::InvalidArg(_) => INVALID_ARGUMENT,
            GpuError::NotSupported(_) => NOT_SUPPORTED,
            GpuError::NoPermission(_) => NO_PERMISSION,
            GpuError::AlreadyInitialized(_) => ALREADY_INITIALIZED,
            GpuError::NotFound(_) => NOT_FOUND,
            GpuError::InsufficientSize(_) => INSUFFICIENT_SIZE,
            GpuError::InsufficientPower(_) => INSUFFICIENT_POWER,
            GpuError::DriverNotLoaded(_) => DRIVER_NOT_LOADED,
            GpuError::Timeout(_) => TIMEOUT,
            GpuError::IrqIssue(_) => IRQ_ISSUE,
            GpuError::LibraryNotFound(_) => LIBRARY_NOT_FOUND,
            GpuError::FunctionNotFound(_) => FUNCTION_NOT_FOUND,
            GpuError::CorruptedInfoRom(_) => CORRUPTED_INFOROM,
            GpuError::GpuLost(_) => GPU_IS_LOST,
            GpuError::ResetRequired(_) => RESET_REQUIRED,
            GpuError::OperatingSystem(_) => OPERATING_SYSTEM,
            GpuError::LibRmVersionMismatch(_) => LIB_RM_VERSION_MISMATCH,
            GpuError::Memory(_) => MEMORY,
            GpuError::Unknown(_) => UNKNOWN,
        }
    }
}

/// NVML's own description of a return code (what `nvmlErrorString` answers).
pub fn nvml_error_string(code: u32) -> &'static str {
    use nvml_code::*;
    match code {
        SUCCESS => "Success",
        UNINITIALIZED => "Uninitialized",
        INVALID_ARGUMENT => "Invalid Argument",
        NOT_SUPPORTED => "Not Supported",
        NO_PERMISSION => "Insufficient Permissions",
        ALREADY_INITIALIZED => "Already Initialized",
        NOT_FOUND => "Not Found",
        INSUFFICIENT_SIZE => "Insufficient Size",
        INSUFFICIENT_POWER => "Insufficient External Power",
        DRIVER_NOT_LOADED => "Driver Not Loaded",
        TIMEOUT => "Timeout",
        IRQ_ISSUE => "Interrupt Request Issue",
        LIBRARY_NOT_FOUND => "NVML Shared Library Not Found",
        FUNCTION_NOT_FOUND => "Function Not Found",
        CORRUPTED_INFOROM => "Corrupted infoROM",
        GPU_IS_LOST => "GPU is lost",
        RESET_REQUIRED => "GPU requires restart",
        OPERATING_SYSTEM => "The operating system has blocked the request.",
        LIB_RM_VERSION_MISMATCH => "RM has detected an NVML/RM version mismatch.",
        IN_USE => "In use by another client",
        MEMORY => "Insufficient Memory",
        NO_DATA => "No data",
        VGPU_ECC_NOT_SUPPORTED => "ECC is not supported for vGPU",
        INSUFFICIENT_RESOURCES => "Insufficient resources",
        FREQ_NOT_SUPPORTED => "Frequency not supported",
        ARGUMENT_VERSION_MISMATCH => "Argument version mismatch",
        DEPRECATED => "Deprecated",
        NOT_READY => "Not ready",
        GPU_NOT_FOUND => "GPU not found",
        INVALID_STATE => "Invalid state",
        _ => "Unknown Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_round_trips_through_its_nvml_code() {
        let all = [
            GpuError::Init(String::new()),
            GpuError::InvalidArg(String::new()),
            GpuError::NotSupported(String::new()),
            GpuError::NoPermission(String::new()),
            GpuError::AlreadyInitialized(String::new()),
            GpuError::NotFound(String::new()),
            GpuError::InsufficientSize(String::new()),
            GpuError::InsufficientPower(String::new()),
            GpuError::DriverNotLoaded(String::new()),
            GpuError::Timeout(String::new()),
            GpuError::IrqIssue(String::new()),
            GpuError::LibraryNotFound(String::new()),
            GpuError::FunctionNotFound(String::new()),
            GpuError::CorruptedInfoRom(String::new()),
            GpuError::GpuLost(String::new()),
            GpuError::ResetRequired(String::new()),
            GpuError::OperatingSystem(String::new()),
            GpuError::LibRmVersionMismatch(String::new()),
            GpuError::Memory(String::new()),
            GpuError::Unknown(String::new()),
        ];
        for e in all {
            let back = GpuError::from_nvml_code(e.nvml_code(), "ctx");
            assert_eq!(back.class_name(), e.class_name());
            assert!(back.message().starts_with("ctx: "));
        }
    }

    #[test]
    fn every_nvml_code_maps_to_some_class() {
        for code in (0..=29).chain([999, 12345]) {
            if code == nvml_code::SUCCESS {
                continue;
            }
            let e = GpuError::from_nvml_code(code, "x");
            assert!(e.class_name().starts_with("ZeusGPU"));
        }
        assert_eq!(
            GpuError::from_nvml_code(19, "x").class_name(),
            "ZeusGPUUnknownError"
        );
    }
}
