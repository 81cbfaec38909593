//! Criterion: the allocator engine over `FakeDevice`: a cached malloc+free pair at 512 B,
//! 1 MiB and 64 MiB against glibc's pair of the same size; the same with history on (no
//! stacks); two threads against one.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cushim_testsupport::workloads::engine;
use std::time::Instant;

const SIZES: [u64; 3] = [512, 1 << 20, 64 << 20];

fn pair(c: &mut Criterion) {
    let (Ok(off), Ok(on)) = (
        engine::allocator("", None),
        engine::allocator("", Some("enabled=all,stacks=none,max_entries=100000")),
    ) else {
        eprintln!("alloc_engine: could not configure the allocator");
        return;
    };
    let mut g = c.benchmark_group("pair");
    for s in SIZES {
        g.bench_with_input(BenchmarkId::new("glibc", s), &s, |b, &s| {
            b.iter_custom(|n| {
                let t = Instant::now();
                engine::glibc_pairs(s, n);
                t.elapsed()
            })
        });
        for (name, a) in [("engine", &off), ("engine_history", &on)] {
            g.bench_with_input(BenchmarkId::new(name, s), &s, |b, &s| {
                b.iter_custom(|n| {
                    let t = Instant::now();
                    engine::pairs(a, s, n);
                    t.elapsed()
                })
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("threads");
    for threads in [1usize, 2] {
        g.bench_with_input(
            BenchmarkId::new("engine_1MiB", threads),
            &threads,
            |b, &t| {
                b.iter_custom(|n| {
                    let start = Instant::now();
                    engine::threaded_pairs_per_s(&off, 1 << 20, t, n.div_ceil(t as u64));
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, pair);
criterion_main!(benches);
