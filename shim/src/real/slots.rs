//! The real-function slots of the driver allocation and stream hooks (`exports/driver.rs`),
//! read by their observing paths (`observe/driver.rs`) too and listed in the symbol table
//! (`lookup/table.rs`).
//!
//! Invariant: each slot is named exactly like the driver function it holds (see [`RealFn`]).

use crate::real::driver::RealFn;

pub static REAL_MEM_ALLOC: RealFn = RealFn::new(c"cuMemAlloc_v2");
pub static REAL_MEM_FREE: RealFn = RealFn::new(c"cuMemFree_v2");
pub static REAL_MEM_ALLOC_HOST: RealFn = RealFn::new(c"cuMemAllocHost_v2");
pub static REAL_MEM_HOST_ALLOC: RealFn = RealFn::new(c"cuMemHostAlloc");
pub static REAL_MEM_FREE_HOST: RealFn = RealFn::new(c"cuMemFreeHost");
pub static REAL_MEM_ALLOC_ASYNC: RealFn = RealFn::new(c"cuMemAllocAsync");
pub static REAL_MEM_ALLOC_ASYNC_PTSZ: RealFn = RealFn::new(c"cuMemAllocAsync_ptsz");
pub static REAL_MEM_FREE_ASYNC: RealFn = RealFn::new(c"cuMemFreeAsync");
pub static REAL_MEM_FREE_ASYNC_PTSZ: RealFn = RealFn::new(c"cuMemFreeAsync_ptsz");
pub static REAL_MEM_GET_INFO: RealFn = RealFn::new(c"cuMemGetInfo_v2");
pub static REAL_STREAM_CREATE: RealFn = RealFn::new(c"cuStreamCreate");
pub static REAL_STREAM_CREATE_PRIO: RealFn = RealFn::new(c"cuStreamCreateWithPriority");
pub static REAL_STREAM_DESTROY: RealFn = RealFn::new(c"cuStreamDestroy_v2");
