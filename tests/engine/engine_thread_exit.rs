//! The only thread that allocated is known exactly, also after it exited: a thread created
//! after it ended (which the C library gives the same thread pointer) counts as a second
//! thread, so once a per-thread default stream was used, what the exited thread freed is
//! ordered before the new thread reuses it. One test in this file: no other thread of the
//! test harness may take the exited thread's stack (and thread pointer) in between.

use crate::common::engine_support;
use engine_support::{pending_blocks, setup};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn pthread_self() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

#[test]
fn a_thread_started_after_the_only_one_exited_counts_as_a_second_thread() {
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    let a = &a;
    // Thread A: the only one that allocates; its work may be on its per-thread default
    // stream, which nothing orders with another thread's.
    let (first, p) = std::thread::scope(|s| {
        s.spawn(|| {
            a.per_thread_streams_used();
            let p = a.malloc(0, 12 * MIB, 0, 0).expect("malloc");
            a.free(p, 0, 0).expect("free");
            (pthread_self(), p)
        })
        .join()
        .expect("thread A")
    });
    assert_eq!(pending_blocks(a), 0, "one thread: its own block at once");
    let c = dev.counters();
    assert_eq!((c.record_event, c.stream_wait_event), (0, 0));
    // Thread B, created after A ended: the C library hands it A's control block.
    let (second, q) = std::thread::scope(|s| {
        s.spawn(|| (pthread_self(), a.malloc(0, 12 * MIB, 0, 0).expect("malloc")))
            .join()
            .expect("thread B")
    });
    assert_eq!(
        first, second,
        "the scenario: B has A's thread pointer (glibc reuses a joined thread's stack)"
    );
    assert_eq!(q, p, "B reuses the block A freed");
    let c = dev.counters();
    assert_eq!(
        (c.record_event, c.stream_wait_event),
        (1, 0),
        "B is a second thread: A's frees were ordered before B's work (one legacy record)"
    );
}
