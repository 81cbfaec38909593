//! `cushim doctor`: on one screen, what a user needs to know before a first run: which
//! driver a program will get (a real one, or simcuda) and its version, the shim that will be
//! preloaded and where that copy came from (with any cache directory refused on the way),
//! whether `membarrier` and frame pointers are available, and whether the snapshot
//! directory is writable.
//!
//! Policy: every check only looks (a probe syscall, a library loaded locally, a file created
//! and removed); the exit status is 0 when `cushim run` can start a program (a shim, and a
//! driver or simcuda), 1 otherwise, so scripts can gate on it.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::locate;

type DriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

/// A loaded driver: the file it came from and `cuDriverGetVersion`'s answer.
struct Driver {
    file: String,
    version: Result<c_int, c_int>,
}

/// Load `name` locally and ask it for its version; None when it does not load.
fn probe_driver(name: &CStr) -> Option<Driver> {
    // SAFETY: dlopen of a library name or path; RTLD_LOCAL keeps its symbols out of the
    // global scope. The handle is kept open: the library stays loaded for the short life of
    // this command, so the function pointer below stays valid.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(h, c"cuDriverGetVersion".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables for an address inside a loaded object.
    let file = if unsafe { libc::dladdr(sym as *const c_void, &mut info) } != 0
        && !info.dli_fname.is_null()
    {
        // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dli_fname as *const c_char) }
            .to_string_lossy()
            .into_owned()
    } else {
        name.to_string_lossy().into_owned()
    };
    // SAFETY: cuDriverGetVersion(int*) is the CUDA driver API's signature for this symbol.
    let f: DriverGetVersion = unsafe { std::mem::transmute(sym) };
    let mut v: c_int = 0;
    // SAFETY: v is a valid int for the call to write.
    let rc = unsafe { f(&mut v) };
    Some(Driver {
        file,
        version: if rc == 0 { Ok(v) } else { Err(rc) },
    })
}

fn cuda_version(v: Result<c_int, c_int>) -> String {
    match v {
        Ok(v) => format!("CUDA {}.{}", v / 1000, (v % 1000) / 10),
        Err(rc) => format!("cuDriverGetVersion failed with error {rc}"),
    }
}

/// Whether the kernel offers the private expedited `membarrier` the allocator's lock uses.
fn membarrier() -> String {
    const MEMBARRIER_CMD_QUERY: c_int = 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    // SAFETY: the QUERY command only returns a bit mask; it changes nothing.
    let mask = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0) };
    if mask < 0 {
        format!(
            "unavailable ({}): the allocator's lock uses a plain fence on every acquisition",
            std::io::Error::last_os_error()
        )
    } else if mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0 {
        "available (private expedited): the allocator's lock is biased".to_string()
    } else {
        "the kernel lacks private expedited: the allocator's lock uses a plain fence".to_string()
    }
}

/// Whether the `python3` on PATH was compiled with frame pointers (the `fp` unwinder then
/// walks through it; otherwise the default `dwarf` unwinder is the one to use).
fn frame_pointers() -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, sysconfig; print(sys.executable); \
             print(sysconfig.get_config_var('CFLAGS') or '')",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let mut lines = text.lines();
            let exe = lines.next().unwrap_or("python3").to_string();
            let flags = lines.next().unwrap_or("");
            if flags.contains("-fno-omit-frame-pointer") {
                format!("{exe} is built with them: CUSHIM_HISTORY=unwinder=fp works through it")
            } else {
                format!("{exe} is built without them: keep the default unwinder=dwarf")
            }
        }
        _ => "no python3 on PATH; the shim itself is built with them".to_string(),
    }
}

/// The directory a snapshot will be written to, and whether a file can be created there.
fn snapshot_dir() -> (PathBuf, Result<(), String>) {
    let dir = std::env::var_os("CUSHIM_SNAPSHOT")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .filter(|p| !p.as_os_str().is_empty())
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."));
    let probe = dir.join(format!(".cushim-doctor-{}", std::process::id()));
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map(|_| {
            let _ = std::fs::remove_file(&probe);
        })
        .map_err(|e| e.to_string());
    (dir, r)
}

pub fn doctor() -> Result<i32, String> {
    let mut ok = true;
    println!("{}", crate::version_line());
    let shim = locate::shim();
    match &shim {
        Ok((p, o)) => {
            println!("shim:           {} ({})", p.display(), o.describe());
            if *o == locate::Origin::Embedded {
                if let Ok(u) = crate::embedded::unpacked() {
                    for r in &u.refused {
                        println!("cache refused:  {r}");
                    }
                }
            }
        }
        Err(e) => {
            ok = false;
            println!("shim:           MISSING: {e}");
        }
    }
    let sim = locate::simcuda();
    let driver = probe_driver(c"libcuda.so.1");
    match &driver {
        Some(d) => println!("driver:         {} ({})", d.file, cuda_version(d.version)),
        None => println!("driver:         none found: `cushim run` uses simcuda (as with --sim)"),
    }
    match &sim {
        Ok((p, o)) => {
            let version = if driver.is_none() {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok();
                c.and_then(|c| probe_driver(&c))
                    .map(|d| format!(", reports {}", cuda_version(d.version)))
                    .unwrap_or_default()
            } else {
                String::new()
            };
            println!(
                "simcuda:        {} ({}{version})",
                p.display(),
                o.describe()
            );
        }
        Err(e) => {
            if driver.is_none() {
                ok = false;
            }
            println!("simcuda:        MISSING: {e}");
        }
    }
    println!("membarrier:     {}", membarrier());
    println!("frame pointers: {}", frame_pointers());
    let (dir, w) = snapshot_dir();
    match w {
        Ok(()) => println!("snapshots:      {} is writable", dir.display()),
        Err(e) => println!(
            "snapshots:      {} is NOT writable ({e}): pass --snapshot elsewhere",
            dir.display()
        ),
    }
    Ok(if ok { 0 } else { 1 })
}
