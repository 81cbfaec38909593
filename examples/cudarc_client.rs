//! A client written with cudarc's safe API, as a published Rust program would use CUDA: a
//! context, the default stream and a second one, `alloc_zeros`, host-to-device,
//! device-to-host and device-to-device copies, events and a join between the streams. It
//! checks every byte it reads back and exits non-zero on any mismatch, so it runs unchanged
//! on a GPU, on simcuda, and under cushim (whose snapshot then names `upload_weights` and
//! `make_activation`, the functions that allocate).
//!
//! Run: `cargo run --example cudarc_client [STEPS]` (with simcuda's library directory on
//! `LD_LIBRARY_PATH`, or on a machine with a driver).

use std::error::Error;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

/// Elements per weight tensor.
const N: usize = 1 << 16;

#[inline(never)]
fn upload_weights(
    stream: &Arc<CudaStream>,
    host: &[f32],
) -> Result<CudaSlice<f32>, Box<dyn Error>> {
    Ok(stream.clone_htod(host)?)
}

#[inline(never)]
fn make_activation(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<f32>, Box<dyn Error>> {
    Ok(stream.alloc_zeros::<f32>(len)?)
}

fn check(what: &str, got: &[f32], want: impl Fn(usize) -> f32) -> Result<(), Box<dyn Error>> {
    match got.iter().enumerate().find(|(i, v)| **v != want(*i)) {
        Some((i, v)) => Err(format!("{what}: element {i} is {v}, expected {}", want(i)).into()),
        None => Ok(()),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let steps: usize = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 8,
    };
    let ctx = CudaContext::new(0)?;
    let main = ctx.default_stream();
    let side = ctx.new_stream()?;
    let host: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let weights = upload_weights(&main, &host)?;
    for step in 0..steps {
        // An activation of varying size on the second stream, after the weights' upload.
        let len = N * (step % 3 + 1);
        let mut act = make_activation(&side, len)?;
        side.join(&main)?;
        side.memcpy_dtod(&weights, &mut act.slice_mut(0..N))?;
        // No synchronize: a copy into pageable memory is complete when it returns.
        let back = side.clone_dtoh(&act)?;
        check("activation", &back, |i| if i < N { i as f32 } else { 0.0 })?;
    }
    // Hand the second stream's work to the default stream with an event, then copy back.
    let done = side.record_event(None)?;
    main.wait(&done)?;
    let copy = main.clone_dtod(&weights)?;
    let back = main.clone_dtoh(&copy)?;
    check("weights copy", &back, |i| i as f32)?;
    main.synchronize()?;
    println!("cudarc_client: OK steps={steps} n={N}");
    Ok(())
}
