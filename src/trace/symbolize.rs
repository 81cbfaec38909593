//! Dump-time symbolization: return address -> frames `{name, filename, line}`.
//!
//! Invariant: each distinct address is resolved once per `Symbolizer` and each distinct
//! frame is stored once (`frames()[i]`); an address maps to one or more frame indices
//! (inlined calls expand innermost first). Names are demangled; file and line come from
//! DWARF where present; otherwise the frame is `module+0xoffset` (or `0x...` when no loaded
//! module contains the address — code unloaded since capture is reported that way).
//!
//! Libraries loaded after the first symbolization are not in the `backtrace` crate's
//! module list; they resolve through `dladdr` (exported symbol name, module+offset).

use std::collections::HashMap;
use std::ffi::CStr;

/// One resolved frame, as a snapshot shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    pub line: u64,
}

/// Resolves addresses with a per-address cache.
#[derive(Debug, Default)]
pub struct Symbolizer {
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    by_ip: HashMap<u64, (u32, u32)>,
    /// Frame indices of all resolved addresses back to back; `by_ip` holds ranges of it.
    spans: Vec<u32>,
}

impl Symbolizer {
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    /// All distinct frames resolved so far.
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// Frame indices of return address `ip` (innermost first), resolving it on first use.
    pub fn resolve(&mut self, ip: u64) -> &[u32] {
        let (start, len) = match self.by_ip.get(&ip) {
            Some(&r) => r,
            None => {
                let found = resolve_uncached(ip);
                let start = self.spans.len() as u32;
                for f in found {
                    let id = self.intern(f);
                    self.spans.push(id);
                }
                let r = (start, self.spans.len() as u32 - start);
                self.by_ip.insert(ip, r);
                r
            }
        };
        &self.spans[start as usize..(start + len) as usize]
    }

    /// Frame indices of a whole stack, appended to `out`.
    pub fn resolve_stack(&mut self, ips: &[u64], out: &mut Vec<u32>) {
        for &ip in ips {
            let ids = self.resolve(ip);
            out.extend_from_slice(ids);
        }
    }

    fn intern(&mut self, f: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }
}

/// Module path and load base of the module containing `addr`, and the nearest exported
/// symbol, via `dladdr`.
fn dladdr(addr: usize) -> Option<(String, usize, Option<String>)> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 {
        return None;
    }
    let cstr = |p: *const libc::c_char| {
        // SAFETY: dladdr returns NUL-terminated strings owned by the loader (or null).
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let module = cstr(info.dli_fname).unwrap_or_default();
    let sym = (!info.dli_sname.is_null()).then(|| {
        // SAFETY: non-null, NUL-terminated, owned by the loader.
        let raw = unsafe { CStr::from_ptr(info.dli_sname) };
        format!("{:#}", backtrace::SymbolName::new(raw.to_bytes()))
    });
    Some((module, info.dli_fbase as usize, sym))
}

fn module_offset(ip: usize) -> (String, String) {
    match dladdr(ip) {
        Some((module, base, sym)) => {
            let short = module.rsplit('/').next().unwrap_or(&module).to_string();
            let at = format!("{short}+{:#x}", ip.wrapping_sub(base));
            (sym.unwrap_or(at), module)
        }
        None => (format!("{ip:#x}"), "??".to_string()),
    }
}

fn resolve_uncached(ip: u64) -> Vec<Frame> {
    if ip == crate::trace::module_epochs::UNKNOWN_IP {
        return vec![Frame {
            name: "<unknown: code unloaded since the capture>".to_string(),
            filename: "??".to_string(),
            line: 0,
        }];
    }
    if let Some((name, filename, line)) = crate::trace::python::frame(ip) {
        return vec![Frame {
            name,
            filename,
            line,
        }];
    }
    // A return address points after the call; the call itself is at ip - 1.
    let lookup = (ip as usize).saturating_sub(1);
    let mut out = Vec::new();
    backtrace::resolve(lookup as *mut libc::c_void, |sym| {
        let name = sym.name().map(|n| format!("{n:#}")); // `#`: without the hash suffix
        let filename = sym.filename().map(|p| p.display().to_string());
        let line = sym.lineno().map(u64::from).unwrap_or(0);
        if name.is_none() && filename.is_none() {
            return;
        }
        let (fallback_name, module) = if name.is_none() || filename.is_none() {
            module_offset(lookup)
        } else {
            (String::new(), String::new())
        };
        out.push(Frame {
            name: name.unwrap_or(fallback_name),
            filename: filename.unwrap_or(module),
            line,
        });
    });
    if out.is_empty() {
        let (name, filename) = module_offset(lookup);
        out.push(Frame {
            name,
            filename,
            line: 0,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_address_falls_back_to_hex() {
        let mut s = Symbolizer::new();
        let ids = s.resolve(0x10).to_vec();
        assert_eq!(ids.len(), 1);
        assert_eq!(s.frames()[ids[0] as usize].name, "0xf");
    }

    #[test]
    fn same_address_resolves_once_and_shares_frames() {
        let mut s = Symbolizer::new();
        let ip = libc::malloc as *const () as usize as u64 + 1;
        let a = s.resolve(ip).to_vec();
        let n = s.frames().len();
        let b = s.resolve(ip).to_vec();
        assert_eq!(a, b);
        assert_eq!(s.frames().len(), n);
        assert!(
            s.frames()[a[0] as usize].name.contains("malloc"),
            "{:?}",
            s.frames()
        );
    }
}
