//! The `Device` trait: the only way the engine reaches memory, streams and events.
//!
//! Invariants: implementations are thread-safe and never call back into the engine. The shim
//! implements it over the real driver (wrapping its calls in relaxed stream-capture mode);
//! the engine's tests implement it over host memory. Every method reports failure as a
//! [`DeviceError`] and never panics.

/// A device (or pinned host) address.
pub type DevPtr = u64;

/// A raw `CUstream`/`cudaStream_t` handle as an integer. `0` is the legacy default stream,
/// `1` (`cudaStreamLegacy`) aliases it, `2` is `cudaStreamPerThread`.
pub type Stream = u64;

/// The legacy default stream.
pub const LEGACY_STREAM: Stream = 0;

/// Why a device call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceError {
    /// The device (or host) has no memory for the request.
    OutOfMemory,
    /// The operation is not allowed while a stream is capturing.
    Capturing,
    /// Virtual memory management is not supported on this device.
    NotSupported,
    /// Any other failure, with the driver's `CUresult` code.
    Driver(i32),
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceError::OutOfMemory => f.write_str("out of memory"),
            DeviceError::Capturing => f.write_str("operation not permitted while capturing"),
            DeviceError::NotSupported => f.write_str("not supported by the device"),
            DeviceError::Driver(code) => write!(f, "driver error {code}"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// Result of a device call.
pub type DevResult<T> = Result<T, DeviceError>;

/// A physical memory allocation made by [`Device::create_physical`] (a
/// `CUmemGenericAllocationHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PhysHandle(pub u64);

/// An event made by [`Device::create_event`] (a `CUevent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// What the engine needs from a CUDA device. `dev` is the device ordinal.
pub trait Device: Send + Sync {
    /// Number of devices.
    fn device_count(&self) -> usize;
    /// `(free, total)` bytes as the driver reports them.
    fn mem_get_info(&self, dev: i32) -> DevResult<(u64, u64)>;

    /// Run `f`, whose calls of this device's methods for `dev` may share one driver scope
    /// (the context made current and capture mode relaxed once, not per call). For a run of
    /// small calls such as a stream-ordering barrier.
    fn batched(&self, dev: i32, f: &mut dyn FnMut()) {
        let _ = dev;
        f()
    }

    /// Allocate an ordinary segment (`cuMemAlloc`).
    fn malloc(&self, dev: i32, size: u64) -> DevResult<DevPtr>;
    /// Free an ordinary segment (`cuMemFree`; synchronizes the device, like the real one).
    fn free(&self, dev: i32, ptr: DevPtr) -> DevResult<()>;

    /// Whether virtual memory management (expandable segments) is available.
    fn vmm_supported(&self, dev: i32) -> bool;
    /// Minimum mapping granularity in bytes (`cuMemGetAllocationGranularity`).
    fn granularity(&self, dev: i32) -> u64;
    /// Reserve a virtual address range (`cuMemAddressReserve`).
    fn reserve(&self, dev: i32, size: u64) -> DevResult<DevPtr>;
    /// Give a reservation back (`cuMemAddressFree`); nothing may be mapped in it.
    fn release_reservation(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()>;
    /// Create physical memory of `size` bytes (`cuMemCreate`).
    fn create_physical(&self, dev: i32, size: u64) -> DevResult<PhysHandle>;
    /// Release physical memory (`cuMemRelease`); it must be unmapped everywhere.
    fn release_physical(&self, dev: i32, handle: PhysHandle) -> DevResult<()>;
    /// Map `handle` at `ptr` (`cuMemMap`). Nothing may touch the range until
    /// [`Device::set_access`] covered it.
    fn map(&self, dev: i32, ptr: DevPtr, size: u64, handle: PhysHandle) -> DevResult<()>;
    /// Make `size` bytes at `ptr`, every byte mapped by [`Device::map`] (one mapping or
    /// several side by side), readable and writable from `dev` and from the devices with
    /// peer access to it: one `cuMemSetAccess` for the whole range, however many mappings
    /// it holds.
    fn set_access(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()>;
    /// Unmap `size` bytes at `ptr` (`cuMemUnmap`).
    fn unmap(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()>;

    /// Create an event without timing (`cuEventCreate(CU_EVENT_DISABLE_TIMING)`).
    fn create_event(&self, dev: i32) -> DevResult<Event>;
    /// Record `event` on `stream` (`cuEventRecord`).
    fn record_event(&self, dev: i32, event: Event, stream: Stream) -> DevResult<()>;
    /// Whether the work before the event's record has completed (`cuEventQuery`).
    fn event_done(&self, dev: i32, event: Event) -> DevResult<bool>;
    /// Wait for the event (`cuEventSynchronize`).
    fn event_sync(&self, dev: i32, event: Event) -> DevResult<()>;
    /// Make all work submitted to `stream` after this call wait for the event's most recent
    /// record (`cuStreamWaitEvent`); the wait is fixed at the call, so the event may be
    /// recorded again at once. The CPU does not wait.
    fn stream_wait_event(&self, dev: i32, stream: Stream, event: Event) -> DevResult<()>;
    /// Destroy the event (`cuEventDestroy`).
    fn destroy_event(&self, dev: i32, event: Event);
    /// Whether `stream` is capturing a graph (events must not be recorded or queried then).
    fn stream_is_capturing(&self, dev: i32, stream: Stream) -> bool;
    /// Whether all work queued on `stream` so far has completed (`cuStreamQuery`; never
    /// asked of a capturing stream). Never waits.
    fn stream_idle(&self, dev: i32, stream: Stream) -> DevResult<bool>;
    /// Wait for all work queued on `stream`.
    fn synchronize_stream(&self, dev: i32, stream: Stream) -> DevResult<()>;
    /// Wait for all work on the device.
    fn synchronize_device(&self, dev: i32) -> DevResult<()>;

    /// Copy `n` bytes of device memory at `src` into host memory at `dst`, waiting for the
    /// copy (`cuMemcpyDtoH`). Devices without copies (bookkeeping ones) say `NotSupported`.
    fn copy_to_host(&self, dev: i32, dst: DevPtr, src: DevPtr, n: u64) -> DevResult<()> {
        let _ = (dev, dst, src, n);
        Err(DeviceError::NotSupported)
    }
    /// Copy `n` bytes of host memory at `src` into device memory at `dst`, waiting for the
    /// copy (`cuMemcpyHtoD`).
    fn copy_to_device(&self, dev: i32, dst: DevPtr, src: DevPtr, n: u64) -> DevResult<()> {
        let _ = (dev, dst, src, n);
        Err(DeviceError::NotSupported)
    }

    /// Allocate pinned host memory with `cuMemHostAlloc` flags (portable 1, devicemap 2,
    /// writecombined 4).
    fn host_alloc(&self, size: u64, flags: u32) -> DevResult<DevPtr>;
    /// Free pinned host memory (`cuMemFreeHost`).
    fn host_free(&self, ptr: DevPtr) -> DevResult<()>;
}
