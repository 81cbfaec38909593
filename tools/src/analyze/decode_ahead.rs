//! A walk of a sequence of chunks decoded on a thread of its own, ahead of the walker.
//!
//! Policy: a walk that decodes each chunk and then works on it uses one core; decoding on
//! a second thread (at most [`AHEAD`] chunks ahead) lets the two overlap. The walker sees
//! every chunk, in order, as a slice it must not keep. Buffers are reused once the walker
//! is done with them, so a walk allocates a few chunks' worth whatever the length of the
//! log. A chunk that does not decode ends the walk there (the decoder says why); a walker
//! that stops early stops the decoding too.
//!
//! Not used for several walkers of one pass (the replays of several threads): measured on
//! two cores, one decoding handed to both cores cost more than the second decoding it
//! saved (each walker then reads every chunk from the other core's cache, and the decoding
//! thread takes turns with the walkers); each of those walkers decodes for itself.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

/// Chunks decoded ahead of the walker.
const AHEAD: usize = 4;

/// Buffers kept for reuse: the chunks the walker may still hold (queued or being read)
/// and one more, so the oldest is usually free again when it is taken.
const POOL: usize = AHEAD + 2;

/// Decode chunks `0..n` in order with `load` (which fills the buffer it is given, cleared
/// first, and says false to end the walk), handing each to `to`.
fn decode<T: Send + Sync>(
    n: usize,
    mut load: impl FnMut(usize, &mut Vec<T>) -> bool,
    to: SyncSender<Arc<Vec<T>>>,
) {
    let mut pool: VecDeque<Arc<Vec<T>>> = VecDeque::with_capacity(POOL + 1);
    for i in 0..n {
        // The oldest buffer, when the walker has let it go; a new one while the pool fills
        // (or when the walker still reads the oldest).
        let mut buf = if pool.len() >= POOL {
            pool.pop_front()
                .and_then(|a| Arc::try_unwrap(a).ok())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if !load(i, &mut buf) {
            return;
        }
        let chunk = Arc::new(buf);
        if to.send(Arc::clone(&chunk)).is_err() {
            return;
        }
        pool.push_back(chunk);
    }
}

/// Walk chunks `0..n` (decoded by `load`, on a thread of its own) with `f` on this thread
/// (`f` need not be sendable), until `f` says false (the decoder then stops, a few chunks
/// ahead at most).
pub fn ahead<T: Send + Sync>(
    n: usize,
    load: impl FnMut(usize, &mut Vec<T>) -> bool + Send,
    mut f: impl FnMut(&[T]) -> bool,
) {
    let (to, rx) = sync_channel(AHEAD);
    std::thread::scope(|s| {
        s.spawn(move || decode(n, load, to));
        for chunk in rx {
            if !f(&chunk) {
                // Dropping the receiver tells the decoder no one listens any more.
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(i: usize, v: &mut Vec<u64>) -> bool {
        v.clear();
        v.extend((0..1000).map(|k| (i * 1000 + k) as u64));
        true
    }

    #[test]
    fn a_chunk_that_does_not_decode_ends_the_walk() {
        let stop = |i: usize, v: &mut Vec<u64>| i < 7 && load(i, v);
        let mut one = 0;
        ahead(50, stop, |c| {
            one += c.len();
            true
        });
        assert_eq!(one, 7000);
    }

    #[test]
    fn the_walk_on_this_thread_sees_every_chunk_in_order() {
        let mut seen = Vec::new();
        ahead(20, load, |c| {
            seen.extend_from_slice(c);
            true
        });
        assert_eq!(seen, (0..20_000).collect::<Vec<u64>>());
    }

    #[test]
    fn a_walker_that_stops_early_stops_the_decoding() {
        let decoded = std::sync::atomic::AtomicUsize::new(0);
        let counting = |i: usize, v: &mut Vec<u64>| {
            decoded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            load(i, v)
        };
        let mut seen = 0;
        ahead(10_000, counting, |_| {
            seen += 1;
            seen < 3
        });
        assert_eq!(seen, 3);
        // The chunks queued and the one being decoded when the walker stopped, no more.
        assert!(decoded.into_inner() <= 3 + AHEAD + 2);
    }
}
