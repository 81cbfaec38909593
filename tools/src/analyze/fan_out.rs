//! One walk of a sequence of chunks, decoded on a thread of its own and handed, decoded, to
//! every walker of the walk, each walker on its own thread.
//!
//! Policy: each chunk is decoded once per walk, however many walkers read it (the walkers
//! of a walk used to decode the whole log each, and decoding costs about as much as a
//! light analysis of its events), and it is decoded ahead of the walkers (at most
//! [`AHEAD`] chunks), so decoding and the walkers' work overlap on the cores. Every walker
//! sees every chunk, in order, as a slice it must not keep. A decoded chunk is shared by
//! reference count, never copied; its buffer is reused once every walker is done with it,
//! so a walk allocates a few chunks' worth whatever the length of the log. A chunk that
//! does not decode ends the walk there for every walker (the decoder says why); a walker
//! that stops early (panics) does not stop the others.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

/// Chunks decoded ahead of the slowest walker.
const AHEAD: usize = 4;

/// Buffers kept for reuse: the chunks the walkers may still hold (queued or being read)
/// and one more, so the oldest is usually free again when it is taken.
const POOL: usize = AHEAD + 2;

/// Decode chunks `0..n` in order with `load` (which fills the buffer it is given, cleared
/// first, and says false to end the walk), handing each to every one of `to`.
fn decode<T: Send + Sync>(
    n: usize,
    mut load: impl FnMut(usize, &mut Vec<T>) -> bool,
    to: Vec<SyncSender<Arc<Vec<T>>>>,
) {
    let mut pool: VecDeque<Arc<Vec<T>>> = VecDeque::with_capacity(POOL + 1);
    for i in 0..n {
        // The oldest buffer, when every walker has let it go; a new one while the pool
        // fills (or when a walker still reads the oldest).
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
        let mut heard = false;
        for t in &to {
            heard |= t.send(Arc::clone(&chunk)).is_ok();
        }
        if !heard {
            return;
        }
        pool.push_back(chunk);
    }
}

/// Channels to `walkers` walkers: the senders and the receivers.
#[allow(clippy::type_complexity)]
fn channels<T>(walkers: usize) -> (Vec<SyncSender<Arc<Vec<T>>>>, Vec<Receiver<Arc<Vec<T>>>>) {
    (0..walkers).map(|_| sync_channel(AHEAD)).unzip()
}

/// Walk chunks `0..n` (decoded by `load`, on a thread of its own) with `f` on this thread
/// (`f` need not be sendable), until `f` says false (the decoder then stops, a few chunks
/// ahead at most).
pub fn ahead<T: Send + Sync>(
    n: usize,
    load: impl FnMut(usize, &mut Vec<T>) -> bool + Send,
    mut f: impl FnMut(&[T]) -> bool,
) {
    let (to, mut from) = channels(1);
    let Some(rx) = from.pop() else { return };
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

/// Walk chunks `0..n` (decoded once, by `load`, on a thread of its own) with `walkers`
/// walkers, each on its own thread: walker `w` makes its state with `init(w)` there (state
/// that cares which thread uses it, as the engine's locks do, is made and used by one
/// thread) and is fed every chunk in order by `f`; the states back, in walker order, once
/// every walker has seen the last chunk.
pub fn fan_out<T: Send + Sync, S: Send>(
    n: usize,
    load: impl FnMut(usize, &mut Vec<T>) -> bool + Send,
    walkers: usize,
    init: impl Fn(usize) -> S + Sync,
    f: impl Fn(&mut S, &[T]) + Sync,
) -> Vec<S> {
    let (to, from) = channels(walkers);
    let (init, f) = (&init, &f);
    std::thread::scope(|s| {
        s.spawn(move || decode(n, load, to));
        let walkers: Vec<_> = from
            .into_iter()
            .enumerate()
            .map(|(w, rx)| {
                s.spawn(move || {
                    let mut st = init(w);
                    for chunk in rx {
                        f(&mut st, &chunk);
                    }
                    st
                })
            })
            .collect();
        walkers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
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
    fn every_walker_sees_every_chunk_in_order() {
        let sums = fan_out(
            50,
            load,
            3,
            |_| Vec::new(),
            |seen: &mut Vec<u64>, c| seen.extend_from_slice(c),
        );
        let all: Vec<u64> = (0..50_000).collect();
        assert_eq!(sums, vec![all.clone(), all.clone(), all]);
    }

    #[test]
    fn a_chunk_that_does_not_decode_ends_the_walk_for_every_walker() {
        let stop = |i: usize, v: &mut Vec<u64>| i < 7 && load(i, v);
        let seen = fan_out(50, stop, 2, |_| 0usize, |n: &mut usize, c| *n += c.len());
        assert_eq!(seen, vec![7000, 7000]);
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
