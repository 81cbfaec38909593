//! simcuda installed as CUDA 13's runtime: `simcuda-lib-13/libcudart.so.13`, a copy of
//! `libsimcuda.so` whose SONAME is `libcudart.so.13` and whose `cuda*` exports carry the
//! version `libcudart.so.13` (`cudaMalloc@@libcudart.so.13`), as NVIDIA's 13.x runtime
//! exports them; `libcudart.so`, `libcuda.so.1` and `libcuda.so` in the same directory point
//! at that one file, so a process gets one simcuda state whichever name it loads.
//!
//! How: libsimcuda.so is linked with a version node `libcudart.so.12` (simcuda/cudart.map)
//! that no symbol uses. The copy renames that string in `.dynstr` (SONAME and version name
//! are the same string, same length), fixes the version definitions' ELF hashes, and points
//! the `.gnu.version` entry of every defined `cuda*` symbol at that version. Nothing else
//! in the file moves. Invariant: the copy is rebuilt whenever libsimcuda.so is newer, via a
//! temporary name and a rename, so concurrent callers never see a half-written library.

use std::io;
use std::path::{Path, PathBuf};

const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
const SHT_GNU_VERSYM: u32 = 0x6fff_ffff;
const OLD: &[u8] = b"libcudart.so.12\0";
const NEW: &[u8] = b"libcudart.so.13\0";

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("libsimcuda.so: {what}"))
}

fn u16_at(b: &[u8], o: usize) -> io::Result<u16> {
    b.get(o..o + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| bad("truncated"))
}

fn u32_at(b: &[u8], o: usize) -> io::Result<u32> {
    b.get(o..o + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| bad("truncated"))
}

fn u64_at(b: &[u8], o: usize) -> io::Result<u64> {
    let lo = u64::from(u32_at(b, o)?);
    let hi = u64::from(u32_at(b, o + 4)?);
    Ok(lo | (hi << 32))
}

/// The System V ELF hash of a version name.
fn elf_hash(name: &[u8]) -> u32 {
    let mut h: u32 = 0;
    for &c in name {
        h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

/// One section header: (type, file offset, size, link).
struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
}

fn sections(b: &[u8]) -> io::Result<Vec<Section>> {
    if b.get(..4) != Some(b"\x7fELF") || b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let shoff = u64_at(b, 0x28)? as usize;
    let shentsize = u16_at(b, 0x3a)? as usize;
    let shnum = u16_at(b, 0x3c)? as usize;
    (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            Ok(Section {
                kind: u32_at(b, h + 4)?,
                offset: u64_at(b, h + 24)? as usize,
                size: u64_at(b, h + 32)? as usize,
                link: u32_at(b, h + 40)? as usize,
            })
        })
        .collect()
}

/// The bytes of libsimcuda.so turned into CUDA 13's runtime (see the module comment).
pub fn as_cudart13(mut b: Vec<u8>) -> io::Result<Vec<u8>> {
    let secs = sections(&b)?;
    let find = |k: u32| {
        secs.iter()
            .find(|s| s.kind == k)
            .ok_or_else(|| bad("section missing"))
    };
    let dynsym = find(SHT_DYNSYM)?;
    let versym = find(SHT_GNU_VERSYM)?;
    let verdef = find(SHT_GNU_VERDEF)?;
    let dynstr = secs.get(dynsym.link).ok_or_else(|| bad("no .dynstr"))?;
    let (s0, s1) = (dynstr.offset, dynstr.offset + dynstr.size);
    // 1. Rename the string everywhere in .dynstr (the SONAME and the version name).
    let mut renamed = 0;
    let mut i = s0;
    while i + OLD.len() <= s1 {
        if b[i..i + OLD.len()] == *OLD && (i == s0 || b[i - 1] == 0) {
            b[i..i + NEW.len()].copy_from_slice(NEW);
            renamed += 1;
            i += OLD.len();
        } else {
            i += 1;
        }
    }
    if renamed == 0 {
        return Err(bad("no libcudart.so.12 in .dynstr"));
    }
    let name_at = |b: &[u8], off: usize| -> io::Result<Vec<u8>> {
        let start = s0 + off;
        let end = b[start..s1]
            .iter()
            .position(|c| *c == 0)
            .ok_or_else(|| bad("unterminated string"))?;
        Ok(b[start..start + end].to_vec())
    };
    // 2. Fix the hashes of the renamed version definitions; find the runtime's version index.
    let mut ndx = None;
    let mut at = verdef.offset;
    loop {
        let flags = u16_at(&b, at + 2)?;
        let index = u16_at(&b, at + 4)?;
        let aux = u32_at(&b, at + 12)? as usize;
        let next = u32_at(&b, at + 16)? as usize;
        let name = name_at(&b, u32_at(&b, at + aux)? as usize)?;
        if name == NEW[..NEW.len() - 1] {
            b[at + 8..at + 12].copy_from_slice(&elf_hash(&name).to_le_bytes());
            if flags & 1 == 0 {
                ndx = Some(index);
            }
        }
        if next == 0 {
            break;
        }
        at += next;
    }
    let ndx = ndx.ok_or_else(|| bad("no libcudart version node (simcuda/cudart.map)"))?;
    // 3. Put every defined cuda* export in that version.
    let count = dynsym.size / 24;
    let mut tagged = 0;
    for k in 0..count {
        let sym = dynsym.offset + k * 24;
        let shndx = u16_at(&b, sym + 6)?;
        let name = name_at(&b, u32_at(&b, sym)? as usize)?;
        if shndx != 0 && name.starts_with(b"cuda") {
            let v = versym.offset + k * 2;
            b[v..v + 2].copy_from_slice(&ndx.to_le_bytes());
            tagged += 1;
        }
    }
    if tagged == 0 {
        return Err(bad("no cuda* exports"));
    }
    Ok(b)
}

/// The names that point at the CUDA 13 runtime file in its layout.
const NAMES_13: [&str; 3] = ["libcudart.so", "libcuda.so.1", "libcuda.so"];

/// Make (idempotently, safely against concurrent callers) `dir/simcuda-lib-13` holding
/// `libcudart.so.13` made from `dir/libsimcuda.so` and the other names as symlinks to it.
pub fn sim_layout_13(dir: &Path) -> io::Result<PathBuf> {
    let lib = dir.join(crate::artifacts::SIMCUDA_LIB);
    let layout = dir.join("simcuda-lib-13");
    std::fs::create_dir_all(&layout)?;
    let target = layout.join("libcudart.so.13");
    let fresh = match (std::fs::metadata(&lib), std::fs::metadata(&target)) {
        (Ok(l), Ok(t)) => t.modified()? >= l.modified()?,
        (Err(e), _) => {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "{}: {e} (build it with `cargo build -p simcuda`)",
                    lib.display()
                ),
            ))
        }
        _ => false,
    };
    if !fresh {
        let bytes = as_cudart13(std::fs::read(&lib)?)?;
        let tmp = layout.join(format!(".libcudart.so.13.{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &target)?;
    }
    for name in NAMES_13 {
        let link = layout.join(name);
        if std::fs::read_link(&link).is_ok_and(|t| t == Path::new("libcudart.so.13")) {
            continue;
        }
        let tmp = layout.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink("libcudart.so.13", &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elf_hash_is_the_system_v_one() {
        assert_eq!(elf_hash(b""), 0);
        assert_eq!(elf_hash(b"GLIBC_2.2.5"), 0x0969_1a75);
    }
}
