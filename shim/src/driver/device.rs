//! `CudaDevice`: the engine's [`Device`] over the real driver API, reached through the
//! driver's own `cuGetProcAddress` (`driver/entry.rs`), so these calls always reach the
//! driver the process uses (through whatever layer sits in front of it), never the shim's
//! own exports. A driver function an older driver lacks turns off the feature that needs it
//! (expandable segments, capture checks, pinned caching) with one `cushim:` line; without
//! the core ones the shim passes every call through.
//!
//! Invariants: every driver call runs with the target device's primary context current
//! (pushed and popped around the call when the thread has another one), and in relaxed
//! stream-capture mode (so a capture in global mode on another thread never turns the shim's
//! own housekeeping into an error or an invalidated capture). Nothing here panics on a driver
//! error; every failure becomes a [`DeviceError`].

use std::ffi::{c_int, c_uint, c_void};
use std::ptr;

use cudarc::driver::sys as cu;

use crate::driver::entry::{self as drv, Need};
use cushim::device::{DevPtr, DevResult, Device, DeviceError, Event, PhysHandle, Stream};
use parking_lot::Mutex;

/// The real driver, as the engine sees it.
pub struct CudaDevice {
    count: usize,
    /// Retained primary contexts per ordinal (0 until first use).
    primary: Mutex<Vec<usize>>,
    /// Whether the driver has every VMM function (expandable segments).
    vmm: bool,
    /// Whether the driver has stream capture (without it nothing ever captures).
    capture: bool,
}

static PINNED_OK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether pinned host allocations are cached (the driver has `cuMemHostAlloc` and
/// `cuMemFreeHost`); when not, the host exports pass them through.
#[inline]
pub fn pinned_supported() -> bool {
    PINNED_OK.load(std::sync::atomic::Ordering::Relaxed)
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_uint = 2;

/// What caching needs at all: without one of these the shim passes every call through.
const CORE: Need = &[
    ("cuInit", drv::has::cuInit),
    ("cuDeviceGetCount", drv::has::cuDeviceGetCount),
    (
        "cuDevicePrimaryCtxRetain",
        drv::has::cuDevicePrimaryCtxRetain,
    ),
    (
        "cuDevicePrimaryCtxGetState",
        drv::has::cuDevicePrimaryCtxGetState,
    ),
    ("cuCtxGetCurrent", drv::has::cuCtxGetCurrent),
    ("cuCtxGetDevice", drv::has::cuCtxGetDevice),
    ("cuCtxPushCurrent_v2", drv::has::cuCtxPushCurrent_v2),
    ("cuCtxPopCurrent_v2", drv::has::cuCtxPopCurrent_v2),
    ("cuCtxSynchronize", drv::has::cuCtxSynchronize),
    ("cuMemGetInfo_v2", drv::has::cuMemGetInfo_v2),
    ("cuMemAlloc_v2", drv::has::cuMemAlloc_v2),
    ("cuMemFree_v2", drv::has::cuMemFree_v2),
    ("cuEventCreate", drv::has::cuEventCreate),
    ("cuEventRecord", drv::has::cuEventRecord),
    ("cuEventQuery", drv::has::cuEventQuery),
    ("cuEventSynchronize", drv::has::cuEventSynchronize),
    ("cuEventDestroy_v2", drv::has::cuEventDestroy_v2),
    ("cuStreamWaitEvent", drv::has::cuStreamWaitEvent),
    ("cuStreamQuery", drv::has::cuStreamQuery),
    ("cuStreamSynchronize", drv::has::cuStreamSynchronize),
];

/// Expandable segments.
const VMM: Need = &[
    ("cuDeviceGetAttribute", drv::has::cuDeviceGetAttribute),
    (
        "cuMemGetAllocationGranularity",
        drv::has::cuMemGetAllocationGranularity,
    ),
    ("cuMemAddressReserve", drv::has::cuMemAddressReserve),
    ("cuMemAddressFree", drv::has::cuMemAddressFree),
    ("cuMemCreate", drv::has::cuMemCreate),
    ("cuMemRelease", drv::has::cuMemRelease),
    ("cuMemMap", drv::has::cuMemMap),
    ("cuMemUnmap", drv::has::cuMemUnmap),
    ("cuMemSetAccess", drv::has::cuMemSetAccess),
];

/// Honouring the program's stream captures.
const CAPTURE: Need = &[
    ("cuStreamIsCapturing", drv::has::cuStreamIsCapturing),
    (
        "cuThreadExchangeStreamCaptureMode",
        drv::has::cuThreadExchangeStreamCaptureMode,
    ),
];

/// The pinned host cache.
const PINNED: Need = &[
    ("cuMemHostAlloc", drv::has::cuMemHostAlloc),
    ("cuMemFreeHost", drv::has::cuMemFreeHost),
];

fn check(r: c_int) -> DevResult<()> {
    match r {
        drv::SUCCESS => Ok(()),
        drv::OUT_OF_MEMORY => Err(DeviceError::OutOfMemory),
        drv::NOT_SUPPORTED => Err(DeviceError::NotSupported),
        drv::CAPTURE_UNSUPPORTED | drv::CAPTURE_INVALIDATED => Err(DeviceError::Capturing),
        other => Err(DeviceError::Driver(other)),
    }
}

thread_local! {
    /// The device whose scope this thread is inside (`Device::batched`), or -1.
    static BATCHED: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) };
}

/// Restores the thread's capture mode and context when dropped (nothing for a call made
/// inside a batched scope, whose outer scope restores them).
struct CallScope {
    mode: c_uint,
    pushed: bool,
    active: bool,
}

impl Drop for CallScope {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        // SAFETY: plain driver calls with valid out-pointers; restoring what `enter` changed.
        unsafe {
            let mut mode = self.mode;
            let _ = drv::cuThreadExchangeStreamCaptureMode(&mut mode);
            if self.pushed {
                let mut old: cu::CUcontext = ptr::null_mut();
                let _ = drv::cuCtxPopCurrent_v2(&mut old);
            }
        }
    }
}

impl CudaDevice {
    /// Initialize the driver. Fails (with the reason) when no driver library is present or
    /// `cuInit` fails, so the shim can fall back to pass-through.
    pub fn new() -> Result<CudaDevice, String> {
        drv::open()?;
        if let Some(f) = drv::first_missing(CORE) {
            return Err(format!("the CUDA driver has no {f}"));
        }
        // SAFETY: cuInit takes flags 0; cuDeviceGetCount writes one int.
        let n = unsafe {
            check(drv::cuInit(0)).map_err(|e| format!("cuInit failed: {e}"))?;
            let mut n = 0;
            check(drv::cuDeviceGetCount(&mut n)).map_err(|e| format!("cuDeviceGetCount: {e}"))?;
            n.max(0) as usize
        };
        // Without them expandable segments are off: the engine says so in one line when they
        // were asked for (the device does not support virtual memory management).
        let vmm = drv::first_missing(VMM).is_none();
        let capture = match drv::first_missing(CAPTURE) {
            Some(f) => {
                // A driver without stream capture runs no capture: nothing captures.
                eprintln!("cushim: the CUDA driver has no {f}; stream-capture checks off");
                false
            }
            None => true,
        };
        if let Some(f) = drv::first_missing(PINNED) {
            eprintln!("cushim: the CUDA driver has no {f}; pinned host memory not cached");
            PINNED_OK.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(CudaDevice {
            count: n,
            primary: Mutex::new(vec![0; n]),
            vmm,
            capture,
        })
    }

    fn primary_ctx(&self, dev: i32) -> DevResult<cu::CUcontext> {
        let idx = usize::try_from(dev).map_err(|_| DeviceError::Driver(101))?;
        let mut prim = self.primary.lock();
        let slot = prim.get_mut(idx).ok_or(DeviceError::Driver(101))?;
        if *slot == 0 {
            let mut ctx: cu::CUcontext = ptr::null_mut();
            // SAFETY: valid out-pointer; `dev` was range-checked against the device count.
            unsafe { check(drv::cuDevicePrimaryCtxRetain(&mut ctx, dev))? };
            *slot = ctx as usize;
        }
        Ok(*slot as cu::CUcontext)
    }

    /// Make `dev`'s primary context current and capture mode relaxed until the scope drops.
    fn enter(&self, dev: i32) -> DevResult<CallScope> {
        if BATCHED.with(|b| b.get()) == dev {
            return Ok(CallScope {
                mode: CAPTURE_MODE_RELAXED,
                pushed: false,
                active: false,
            });
        }
        let want = self.primary_ctx(dev)?;
        let mut cur: cu::CUcontext = ptr::null_mut();
        // SAFETY: valid out-pointers; the pushed context is a retained primary context.
        unsafe {
            check(drv::cuCtxGetCurrent(&mut cur))?;
            let pushed = cur != want;
            if pushed {
                check(drv::cuCtxPushCurrent_v2(want))?;
            }
            let mut mode = CAPTURE_MODE_RELAXED;
            let _ = drv::cuThreadExchangeStreamCaptureMode(&mut mode);
            Ok(CallScope {
                mode,
                pushed,
                active: true,
            })
        }
    }

    fn mem_prop(dev: i32) -> cu::CUmemAllocationProp {
        // SAFETY: the struct is plain C data for which all-zero is a valid value.
        let mut prop: cu::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        prop
    }
}

impl Device for CudaDevice {
    fn device_count(&self) -> usize {
        self.count
    }

    fn batched(&self, dev: i32, f: &mut dyn FnMut()) {
        let outer = BATCHED.with(|b| b.get());
        if outer == dev {
            return f();
        }
        /// Puts the outer batched device back, also if `f` unwinds.
        struct Restore(i32);
        impl Drop for Restore {
            fn drop(&mut self) {
                BATCHED.with(|b| b.set(self.0));
            }
        }
        // Without a scope each call enters its own; that is only slower. Dropped after
        // `_restore` (reverse order of declaration).
        let scope = self.enter(dev);
        let _restore = Restore(outer);
        if scope.is_ok() {
            BATCHED.with(|b| b.set(dev));
        }
        f();
    }

    fn mem_get_info(&self, dev: i32) -> DevResult<(u64, u64)> {
        let _s = self.enter(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        unsafe { check(drv::cuMemGetInfo_v2(&mut free, &mut total))? };
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, dev: i32, size: u64) -> DevResult<DevPtr> {
        let _s = self.enter(dev)?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        unsafe { check(drv::cuMemAlloc_v2(&mut p, size as usize))? };
        Ok(p)
    }

    fn free(&self, dev: i32, ptr: DevPtr) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: `ptr` came from `malloc` on this device.
        unsafe { check(drv::cuMemFree_v2(ptr)) }
    }

    fn vmm_supported(&self, dev: i32) -> bool {
        if !self.vmm {
            return false;
        }
        let Ok(_s) = self.enter(dev) else {
            return false;
        };
        let mut v = 0;
        // SAFETY: valid out-pointer, device ordinal checked by `enter`.
        let r = unsafe {
            drv::cuDeviceGetAttribute(
                &mut v,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
                    as c_int,
                dev,
            )
        };
        r == drv::SUCCESS && v != 0
    }

    fn granularity(&self, dev: i32) -> u64 {
        const FALLBACK: u64 = 2 << 20;
        let Ok(_s) = self.enter(dev) else {
            return FALLBACK;
        };
        let prop = Self::mem_prop(dev);
        let mut g = 0usize;
        // SAFETY: valid pointers to a filled property struct and an out-size.
        let r = unsafe {
            drv::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM as c_uint,
            )
        };
        if r == drv::SUCCESS && g > 0 {
            g as u64
        } else {
            FALLBACK
        }
    }

    fn reserve(&self, dev: i32, size: u64) -> DevResult<DevPtr> {
        let _s = self.enter(dev)?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; alignment 0 means the granularity.
        unsafe { check(drv::cuMemAddressReserve(&mut p, size as usize, 0, 0, 0))? };
        Ok(p)
    }

    fn release_reservation(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the range came from `reserve`.
        unsafe { check(drv::cuMemAddressFree(ptr, size as usize)) }
    }

    fn create_physical(&self, dev: i32, size: u64) -> DevResult<PhysHandle> {
        let _s = self.enter(dev)?;
        let mut prop = Self::mem_prop(dev);
        // Pages that can be exported are what IPC of expandable blocks shares.
        prop.requestedHandleTypes = handle_types(dev);
        let mut h: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid pointers.
        unsafe { check(drv::cuMemCreate(&mut h, size as usize, &prop, 0))? };
        Ok(PhysHandle(h))
    }

    fn release_physical(&self, dev: i32, handle: PhysHandle) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the handle came from `create_physical`.
        unsafe { check(drv::cuMemRelease(handle.0)) }
    }

    fn map(&self, dev: i32, ptr: DevPtr, size: u64, handle: PhysHandle) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: range inside a reservation of ours, handle of ours.
        unsafe { check(drv::cuMemMap(ptr, size as usize, 0, handle.0, 0)) }
    }

    fn set_access(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()> {
        let _s = self.enter(dev)?;
        let mut desc = cu::CUmemAccessDesc {
            location: Self::mem_prop(dev).location,
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        desc.location.id = dev;
        // SAFETY: a fully mapped range inside a reservation of ours, one access descriptor.
        unsafe { check(drv::cuMemSetAccess(ptr, size as usize, &desc, 1))? };
        // Devices with peer access to `dev` reach its expandable pages too.
        crate::driver::peers::grant_new_mapping(dev, ptr, size).map_err(DeviceError::Driver)
    }

    fn unmap(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the range was mapped by `map`.
        unsafe { check(drv::cuMemUnmap(ptr, size as usize)) }
    }

    fn create_event(&self, dev: i32) -> DevResult<Event> {
        let _s = self.enter(dev)?;
        let mut ev: cu::CUevent = ptr::null_mut();
        // SAFETY: valid out-pointer; flag 2 = CU_EVENT_DISABLE_TIMING.
        unsafe { check(drv::cuEventCreate(&mut ev, 2))? };
        Ok(Event(ev as u64))
    }

    fn record_event(&self, dev: i32, event: Event, stream: Stream) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the event came from `create_event`; the stream is a live program stream.
        unsafe {
            check(drv::cuEventRecord(
                event.0 as cu::CUevent,
                stream as cu::CUstream,
            ))
        }
    }

    fn event_done(&self, dev: i32, event: Event) -> DevResult<bool> {
        let _s = self.enter(dev)?;
        // SAFETY: the event came from `create_event`.
        match unsafe { drv::cuEventQuery(event.0 as cu::CUevent) } {
            drv::SUCCESS => Ok(true),
            drv::NOT_READY => Ok(false),
            other => check(other).map(|_| false),
        }
    }

    fn event_sync(&self, dev: i32, event: Event) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the event came from `create_event`.
        unsafe { check(drv::cuEventSynchronize(event.0 as cu::CUevent)) }
    }

    fn stream_wait_event(&self, dev: i32, stream: Stream, event: Event) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the event came from `create_event`; the stream is a live program stream
        // (or 0); flags 0.
        unsafe {
            check(drv::cuStreamWaitEvent(
                stream as cu::CUstream,
                event.0 as cu::CUevent,
                0,
            ))
        }
    }

    fn destroy_event(&self, dev: i32, event: Event) {
        if let Ok(_s) = self.enter(dev) {
            // SAFETY: the event came from `create_event` and is destroyed once.
            let _ = unsafe { drv::cuEventDestroy_v2(event.0 as cu::CUevent) };
        }
    }

    fn stream_is_capturing(&self, dev: i32, stream: Stream) -> bool {
        if !self.capture {
            return false;
        }
        let Ok(_s) = self.enter(dev) else {
            return false;
        };
        let mut st: c_uint = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { drv::cuStreamIsCapturing(stream as cu::CUstream, &mut st) };
        r != drv::SUCCESS || st != 0
    }

    fn stream_idle(&self, dev: i32, stream: Stream) -> DevResult<bool> {
        let _s = self.enter(dev)?;
        // SAFETY: a live program stream (or 0), not capturing (checked by the caller).
        match unsafe { drv::cuStreamQuery(stream as cu::CUstream) } {
            drv::SUCCESS => Ok(true),
            drv::NOT_READY => Ok(false),
            other => check(other).map(|_| false),
        }
    }

    fn synchronize_stream(&self, dev: i32, stream: Stream) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: a live program stream (or 0).
        unsafe { check(drv::cuStreamSynchronize(stream as cu::CUstream)) }
    }

    fn synchronize_device(&self, dev: i32) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: no arguments.
        unsafe { check(drv::cuCtxSynchronize()) }
    }

    fn copy_to_host(&self, dev: i32, dst: DevPtr, src: DevPtr, n: u64) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the caller passes `n` writable host bytes at `dst` and `n` bytes of device
        // memory at `src`.
        unsafe { check(drv::cuMemcpyDtoH_v2(dst as *mut c_void, src, n as usize)) }
    }

    fn copy_to_device(&self, dev: i32, dst: DevPtr, src: DevPtr, n: u64) -> DevResult<()> {
        let _s = self.enter(dev)?;
        // SAFETY: the caller passes `n` readable host bytes at `src` and `n` bytes of device
        // memory at `dst`.
        unsafe { check(drv::cuMemcpyHtoD_v2(dst, src as *const c_void, n as usize)) }
    }

    fn host_alloc(&self, size: u64, flags: u32) -> DevResult<DevPtr> {
        let _s = self.enter(0)?;
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { check(drv::cuMemHostAlloc(&mut p, size as usize, flags))? };
        Ok(p as u64)
    }

    fn host_free(&self, ptr: DevPtr) -> DevResult<()> {
        let _s = self.enter(0)?;
        // SAFETY: the pointer came from `host_alloc`.
        unsafe { check(drv::cuMemFreeHost(ptr as *mut c_void)) }
    }
}

/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
const POSIX_FD_SUPPORTED_ATTRIBUTE: c_int = 103;

/// The handle types the cache's pages ask for on `dev`: POSIX descriptors when the device
/// can export them (so blocks of expandable segments can be shared), else none.
pub fn handle_types(dev: c_int) -> cu::CUmemAllocationHandleType {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; an attribute every CUDA 12 driver defines.
    let rc = unsafe { drv::cuDeviceGetAttribute(&mut v, POSIX_FD_SUPPORTED_ATTRIBUTE, dev) };
    if rc == drv::SUCCESS && v == 1 {
        cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    }
}
