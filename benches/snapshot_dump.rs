//! Criterion: snapshot dump (build + encode + atomic write) of 100,000 and 1,000,000 events
//! with 32-frame stacks (1,000,000 as pickle only: the inline formats take tens of seconds
//! per dump there); prints the bytes on disk of each.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cushim::snapshot::Format;
use cushim_testsupport::workloads::snapshot;
use std::time::{Duration, Instant};

fn snapshot_dump(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("cushim-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("snapshot_dump: creating {}: {e}", dir.display());
        return;
    }
    let mut g = c.benchmark_group("snapshot_dump");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    for n in [100_000usize, 1_000_000] {
        let input = snapshot::input(n, 32);
        for f in [Format::Pickle, Format::Msgpack, Format::Json] {
            if n > 100_000 && f != Format::Pickle {
                // JSON and msgpack write every frame inline (about 7 GB and 45 s per dump at
                // 1M events here): `cushim bench --full` measures them once.
                continue;
            }
            let path = dir.join(format!("snap-{n}.{}", snapshot::ext(f)));
            match snapshot::dump(&input, f, &path) {
                Ok(bytes) => println!(
                    "snapshot_dump/{}/{n}: {bytes} bytes on disk",
                    snapshot::ext(f)
                ),
                Err(e) => {
                    eprintln!("snapshot_dump: {e}");
                    continue;
                }
            }
            g.bench_with_input(BenchmarkId::new(snapshot::ext(f), n), &n, |b, _| {
                b.iter_custom(|iters| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        if let Err(e) = snapshot::dump(&input, f, &path) {
                            eprintln!("snapshot_dump: {e}");
                        }
                    }
                    t.elapsed()
                })
            });
        }
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, snapshot_dump);
criterion_main!(benches);
