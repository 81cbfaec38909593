//! Criterion: per-event recording cost with history off (the baseline), on without stacks,
//! and with native stacks through the DWARF and frame-pointer unwinders at depths 8/32/64.
//! `cushim bench` prints the same figures as one table with ratios and targets.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cushim::config::history::Unwinder;
use cushim_testsupport::workloads::trace;
use std::time::Instant;

fn event_record(c: &mut Criterion) {
    let mut g = c.benchmark_group("event_record");
    g.bench_function("history_off", |b| {
        b.iter_custom(|n| {
            let t = Instant::now();
            trace::record_off(n);
            t.elapsed()
        })
    });
    let mut ring = trace::full_ring(100_000);
    g.bench_function("history_no_stack", |b| {
        b.iter_custom(|n| {
            let t = Instant::now();
            trace::record_no_stack(&mut ring, n);
            t.elapsed()
        })
    });
    for (name, u) in [("stack_dwarf", Unwinder::Dwarf), ("stack_fp", Unwinder::Fp)] {
        for depth in [8usize, 32, 64] {
            g.bench_with_input(BenchmarkId::new(name, depth), &depth, |b, &d| {
                b.iter_custom(|n| {
                    let t = Instant::now();
                    trace::record_with_stack(&mut ring, u, d, n);
                    t.elapsed()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, event_record);
criterion_main!(benches);
