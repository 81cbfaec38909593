//! Wall-clock medians for the quick mode: calibrated batches, median of several.
//!
//! Invariant: a figure is the median over `repeats` batches of the time per iteration,
//! each batch long enough (about `batch`) that the clock's resolution does not matter.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Median nanoseconds per iteration of `f(iters)` (which must run `iters` iterations).
pub fn median_ns(batch: Duration, repeats: usize, mut f: impl FnMut(u64)) -> f64 {
    let iters = calibrate(batch, &mut f);
    let mut v: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let t = Instant::now();
            f(black_box(iters));
            t.elapsed().as_secs_f64() * 1e9 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The iterations of `f` that take about `batch` (after one warm-up call): iterations
/// quadrupled until a run takes a quarter of `batch`, then scaled to the whole of it.
fn calibrate(batch: Duration, f: &mut dyn FnMut(u64)) -> u64 {
    f(1);
    let mut iters = 1u64;
    loop {
        let t = Instant::now();
        f(iters);
        let e = t.elapsed();
        if e >= batch / 4 || iters >= 1 << 30 {
            let per = e.as_secs_f64() / iters as f64;
            return ((batch.as_secs_f64() / per.max(1e-12)) as u64).clamp(1, 1 << 32);
        }
        iters *= 4;
    }
}

/// Median seconds of `repeats` runs of `f` (for long operations such as a dump), and the
/// last run's result.
pub fn median_secs<T>(repeats: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut v = Vec::with_capacity(repeats.max(1));
    let mut run = || {
        let t = Instant::now();
        let out = f();
        (t.elapsed().as_secs_f64(), out)
    };
    let (secs, mut last) = run();
    v.push(secs);
    for _ in 1..repeats.max(1) {
        let (secs, out) = run();
        v.push(secs);
        last = out;
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], last)
}

/// Least-squares line through `(x, y)` points: `(slope, intercept)`.
pub fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if n < 2.0 {
        return (0.0, points.first().map_or(0.0, |p| p.1));
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (slope, my - slope * mx)
}

/// Like [`median_ns`] for several workloads at once, their batches interleaved (a, b, c,
/// a, b, c, ...) so that a change in machine load hits all of them alike. Returns the
/// median nanoseconds per iteration of each, in order.
pub fn median_ns_interleaved(
    batch: Duration,
    repeats: usize,
    fs: &mut [&mut dyn FnMut(u64)],
) -> Vec<f64> {
    let iters: Vec<u64> = fs.iter_mut().map(|f| calibrate(batch, f)).collect();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); fs.len()];
    for _ in 0..repeats.max(1) {
        for (i, f) in fs.iter_mut().enumerate() {
            let t = Instant::now();
            f(black_box(iters[i]));
            samples[i].push(t.elapsed().as_secs_f64() * 1e9 / iters[i] as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_line_recovers_slope_and_intercept_of_exact_points() {
        let (slope, icpt) = fit_line(&[(8.0, 140.0), (32.0, 380.0), (64.0, 700.0)]);
        assert!((slope - 10.0).abs() < 1e-9, "{slope}");
        assert!((icpt - 60.0).abs() < 1e-9, "{icpt}");
    }

    #[test]
    fn interleaved_medians_keep_the_order_and_scale_of_their_workloads() {
        let spin = |k: u64| {
            move |n: u64| {
                let mut x = 0u64;
                for i in 0..n * k {
                    x = black_box(x.wrapping_add(i));
                }
            }
        };
        // A thousandfold difference in work, so that no scheduling noise on a loaded
        // machine can invert the order of the medians.
        let (mut a, mut b) = (spin(1), spin(1000));
        let m = median_ns_interleaved(Duration::from_millis(2), 3, &mut [&mut a, &mut b]);
        assert_eq!(m.len(), 2);
        assert!(m[0] > 0.0 && m[1] > m[0], "{m:?}");
    }
}
