//! The checksum of a host backup: computed when the bytes reach host memory, checked before
//! they go back to the device, so a backup changed in between (a stray write, a bad page) is
//! an error at resume, never silently restored.
//!
//! Policy: XXH3-64 (twox-hash), whose SIMD loop runs at the speed memory feeds it and whose
//! streamed sum equals its one-shot sum, so pieces can be summed as they arrive. Not
//! cryptographic: it detects corruption, not an adversary.
//!
//! The copies and the sums overlap ([`sums_behind`]): a helper thread sums piece `k` while the
//! caller copies piece `k + 1`, so a backup costs about its copies, not its copies plus its
//! sums (on a GPU the copy engine moves the bytes and the CPU only sums; on simcuda the copy
//! is itself a CPU memcpy, on the caller's core). Where no thread can be started the caller
//! sums the pieces itself once they are all copied: slower, same result.

use std::hash::Hasher;
use std::sync::mpsc::sync_channel;

use twox_hash::XxHash3_64;

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// Bytes per piece: one driver copy each, summed while the next is copied. Large enough that
/// a driver call's fixed cost (microseconds on a GPU) is small against its transfer, small
/// enough that the pieces in flight stay in the CPU's last-level cache.
pub const PIECE: u64 = 4 << 20;

/// Pieces copied ahead of the summing thread at most.
const AHEAD: usize = 3;

/// A piece handed to [`sums_behind`]'s feed: which buffer it belongs to and its bytes.
#[derive(Clone, Copy)]
struct Piece {
    part: usize,
    at: usize,
    len: usize,
}

/// The checksums of `parts` buffers, each fed in order piece by piece by `produce` through
/// the function it is given (`feed(part, address, length)`), summed behind it on a helper
/// thread when they total more than one piece (`bytes`; for one piece or less a thread
/// would cost more than it saves). Stops at `produce`'s first error and returns it.
///
/// # Safety
/// Each piece fed must be `length` readable bytes at `address` that nothing changes or frees
/// until this function returns.
pub unsafe fn sums_behind<E>(
    parts: usize,
    bytes: u64,
    produce: impl FnOnce(&mut dyn FnMut(usize, u64, u64)) -> Result<(), E>,
) -> Result<Vec<u64>, E> {
    let new = || (0..parts).map(|_| XxHash3_64::new()).collect::<Vec<_>>();
    let sum = |hashers: &mut [XxHash3_64], p: Piece| {
        // SAFETY: the caller promises the piece stays readable and unchanged until we return.
        let bytes = unsafe { std::slice::from_raw_parts(p.at as *const u8, p.len) };
        if let Some(h) = hashers.get_mut(p.part) {
            h.write(bytes);
        }
    };
    // Every piece, in order, to sum them here if the helper cannot (no thread to be had).
    let mut fed: Vec<Piece> = Vec::new();
    let (tx, rx) = sync_channel::<Piece>(AHEAD);
    let (produced, behind) = std::thread::scope(|s| {
        let helper = (bytes > PIECE)
            .then(|| {
                crate::quiet_thread::spawn_quiet_scoped(s, "cushim-sum", || {
                    let mut hs = new();
                    for p in rx {
                        sum(&mut hs, p);
                    }
                    hs
                })
                .ok()
            })
            .flatten();
        let live = helper.is_some();
        let produced = produce(&mut |part, at, len| {
            let p = Piece {
                part,
                at: at as usize,
                len: len as usize,
            };
            fed.push(p);
            if live {
                let _ = tx.send(p);
            }
        });
        drop(tx);
        (produced, helper.and_then(|h| h.join().ok()))
    });
    produced?;
    let hashers = behind.unwrap_or_else(|| {
        let mut hs = new();
        for &p in &fed {
            sum(&mut hs, p);
        }
        hs
    });
    Ok(hashers.iter().map(|h| h.finish()).collect())
}

#[cfg(test)]
mod tests {
    use super::{checksum, sums_behind, PIECE};

    #[test]
    fn any_changed_byte_or_length_changes_the_checksum() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let base = checksum(&data);
        for at in [0, 31, 32, 500, 999] {
            let mut d = data.clone();
            d[at] ^= 1;
            assert_ne!(checksum(&d), base, "byte {at}");
        }
        assert_ne!(checksum(&data[..999]), base);
        assert_eq!(checksum(&data), base);
    }

    #[test]
    fn sums_fed_piece_by_piece_behind_the_caller_or_by_it_equal_each_buffers_checksum() {
        let a: Vec<u8> = (0..(2 * PIECE as usize + 12345))
            .map(|i| (i * 31 + i / 977) as u8)
            .collect();
        let b: Vec<u8> = (0..70_001u32).map(|i| (i % 251) as u8).collect();
        let bufs = [&a[..], &b[..]];
        // Declared as more than a piece: summed on the helper; as none: by the caller.
        for bytes in [(a.len() + b.len()) as u64, 0] {
            // SAFETY: both buffers outlive the call and are not changed during it.
            let sums = unsafe {
                sums_behind::<()>(2, bytes, |feed| {
                    for (part, buf) in bufs.iter().enumerate() {
                        for piece in buf.chunks(PIECE as usize / 3) {
                            feed(part, piece.as_ptr() as u64, piece.len() as u64);
                        }
                    }
                    Ok(())
                })
            };
            assert_eq!(sums, Ok(vec![checksum(&a), checksum(&b)]), "{bytes}");
        }
    }

    #[test]
    fn the_producers_error_is_returned_as_it_is() {
        // SAFETY: nothing is fed.
        let r = unsafe { sums_behind(1, 0, |_| Err("copy failed")) };
        assert_eq!(r, Err("copy failed"));
    }
}
