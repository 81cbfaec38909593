//! CUDA driver (`CUresult`) and runtime (`cudaError_t`) codes with their documented names and
//! strings. Invariant: every code simcuda returns appears in `TABLE`, and the runtime code of
//! a driver failure is the same number (true for every code simcuda uses).

/// `CUresult` / `cudaError_t` as the C enums they are.
pub type CUresult = u32;

pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const OUT_OF_MEMORY: CUresult = 2;
pub const NOT_INITIALIZED: CUresult = 3;
pub const DEINITIALIZED: CUresult = 4;
pub const INVALID_DEVICE_POINTER: CUresult = 17;
pub const INVALID_MEMCPY_DIRECTION: CUresult = 21;
pub const NO_DEVICE: CUresult = 100;
pub const INVALID_DEVICE: CUresult = 101;
pub const PEER_ACCESS_UNSUPPORTED: CUresult = 217;
pub const INVALID_CONTEXT: CUresult = 201;
pub const MAP_FAILED: CUresult = 205;
pub const INVALID_HANDLE: CUresult = 400;
pub const ILLEGAL_STATE: CUresult = 401;
pub const NOT_FOUND: CUresult = 500;
pub const NOT_READY: CUresult = 600;
pub const PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const ILLEGAL_ADDRESS: CUresult = 700;
pub const NOT_PERMITTED: CUresult = 800;
pub const NOT_SUPPORTED: CUresult = 801;
pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub const STREAM_CAPTURE_IMPLICIT: CUresult = 906;
pub const STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
pub const UNKNOWN: CUresult = 999;

/// (code, driver name, runtime name, string), as CUDA 12 documents them.
const TABLE: &[(CUresult, &str, &str, &str)] = &[
    (0, "CUDA_SUCCESS", "cudaSuccess", "no error"),
    (
        1,
        "CUDA_ERROR_INVALID_VALUE",
        "cudaErrorInvalidValue",
        "invalid argument",
    ),
    (
        2,
        "CUDA_ERROR_OUT_OF_MEMORY",
        "cudaErrorMemoryAllocation",
        "out of memory",
    ),
    (
        3,
        "CUDA_ERROR_NOT_INITIALIZED",
        "cudaErrorInitializationError",
        "initialization error",
    ),
    (
        4,
        "CUDA_ERROR_DEINITIALIZED",
        "cudaErrorCudartUnloading",
        "driver shutting down",
    ),
    (
        17,
        "CUDA_ERROR_INVALID_VALUE",
        "cudaErrorInvalidDevicePointer",
        "invalid device pointer",
    ),
    (
        21,
        "CUDA_ERROR_INVALID_VALUE",
        "cudaErrorInvalidMemcpyDirection",
        "invalid copy direction for memcpy",
    ),
    (
        100,
        "CUDA_ERROR_NO_DEVICE",
        "cudaErrorNoDevice",
        "no CUDA-capable device is detected",
    ),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE",
        "cudaErrorInvalidDevice",
        "invalid device ordinal",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT",
        "cudaErrorDeviceUninitialized",
        "invalid device context",
    ),
    (
        205,
        "CUDA_ERROR_MAP_FAILED",
        "cudaErrorMapBufferObjectFailed",
        "mapping of buffer object failed",
    ),
    (
        400,
        "CUDA_ERROR_INVALID_HANDLE",
        "cudaErrorInvalidResourceHandle",
        "invalid resource handle",
    ),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE",
        "cudaErrorIllegalState",
        "the operation cannot be performed in the present state",
    ),
    (
        500,
        "CUDA_ERROR_NOT_FOUND",
        "cudaErrorSymbolNotFound",
        "named symbol not found",
    ),
    (
        217,
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        "cudaErrorPeerAccessUnsupported",
        "peer access is not supported between these two devices",
    ),
    (
        704,
        "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        "cudaErrorPeerAccessAlreadyEnabled",
        "peer access is already enabled",
    ),
    (
        705,
        "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        "cudaErrorPeerAccessNotEnabled",
        "peer access has not been enabled",
    ),
    (
        600,
        "CUDA_ERROR_NOT_READY",
        "cudaErrorNotReady",
        "device not ready",
    ),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "cudaErrorIllegalAddress",
        "an illegal memory access was encountered",
    ),
    (
        800,
        "CUDA_ERROR_NOT_PERMITTED",
        "cudaErrorNotPermitted",
        "operation not permitted",
    ),
    (
        801,
        "CUDA_ERROR_NOT_SUPPORTED",
        "cudaErrorNotSupported",
        "operation not supported",
    ),
    (
        900,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "cudaErrorStreamCaptureUnsupported",
        "operation not permitted when stream is capturing",
    ),
    (
        901,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "cudaErrorStreamCaptureInvalidated",
        "operation failed due to a previous error during capture",
    ),
    (
        902,
        "CUDA_ERROR_STREAM_CAPTURE_MERGE",
        "cudaErrorStreamCaptureMerge",
        "operation would result in a merge of separate capture sequences",
    ),
    (
        903,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        "cudaErrorStreamCaptureUnmatched",
        "capture was not ended in the same stream as it began",
    ),
    (
        904,
        "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        "cudaErrorStreamCaptureUnjoined",
        "capturing stream has unjoined work",
    ),
    (
        905,
        "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        "cudaErrorStreamCaptureIsolation",
        "dependency created on uncaptured work in another stream",
    ),
    (
        906,
        "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        "cudaErrorStreamCaptureImplicit",
        "operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (
        907,
        "CUDA_ERROR_CAPTURED_EVENT",
        "cudaErrorCapturedEvent",
        "operation not permitted on an event last recorded in a capturing stream",
    ),
    (
        908,
        "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        "cudaErrorStreamCaptureWrongThread",
        "attempt to terminate a thread-local capture sequence from another thread",
    ),
    (
        999,
        "CUDA_ERROR_UNKNOWN",
        "cudaErrorUnknown",
        "unknown error",
    ),
];

fn entry(code: CUresult) -> Option<&'static (CUresult, &'static str, &'static str, &'static str)> {
    TABLE.iter().find(|e| e.0 == code)
}

/// NUL-terminated static copies of the table's strings, for the C API.
fn cstr(s: &'static str) -> *const libc::c_char {
    use once_cell::sync::Lazy;
    use std::collections::HashMap;
    use std::ffi::CString;
    static CACHE: Lazy<HashMap<&'static str, CString>> = Lazy::new(|| {
        let mut m = HashMap::new();
        for e in TABLE {
            for s in [e.1, e.2, e.3] {
                if let Ok(c) = CString::new(s) {
                    m.insert(s, c);
                }
            }
        }
        for s in [UNRECOGNIZED] {
            if let Ok(c) = CString::new(s) {
                m.insert(s, c);
            }
        }
        m
    });
    CACHE.get(s).map_or(std::ptr::null(), |c| c.as_ptr())
}

const UNRECOGNIZED: &str = "unrecognized error code";

/// Driver name (`CUDA_ERROR_...`), or `None` for a code the driver does not define.
pub fn driver_name(code: CUresult) -> Option<*const libc::c_char> {
    match code {
        17 | 21 => None,
        _ => entry(code).map(|e| cstr(e.1)),
    }
}

/// Driver description, or `None` for an unknown code.
pub fn driver_string(code: CUresult) -> Option<*const libc::c_char> {
    match code {
        17 | 21 => None,
        _ => entry(code).map(|e| cstr(e.3)),
    }
}

/// Runtime name (`cudaError...`); unknown codes give "unrecognized error code" as cudart does.
pub fn runtime_name(code: CUresult) -> *const libc::c_char {
    cstr(entry(code).map_or(UNRECOGNIZED, |e| e.2))
}

/// Runtime description; unknown codes give "unrecognized error code".
pub fn runtime_string(code: CUresult) -> *const libc::c_char {
    cstr(entry(code).map_or(UNRECOGNIZED, |e| e.3))
}

/// Rust-side name, for messages.
pub fn name_of(code: CUresult) -> &'static str {
    entry(code).map_or("unknown", |e| e.1)
}
