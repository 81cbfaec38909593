//! `cushim bench` rows for the observing mode: its table operation, and the cost of
//! recording Python frames.
//!
//! Invariant: each figure is measured next to its baseline in the same run (the same work
//! without the thing measured), and a row that cannot be measured says why.

use std::time::Duration;

use cushim::alloc::observed::{Kind, ObservedTable, Record};
use cushim::trace::event::{EventSink, NullSink};

use cushim_tools::workloads::procs::ProcEnv;
use cushim_tools::workloads::table::Row;
use cushim_tools::workloads::{engine, timing};

/// What observing adds to a call without history: one record and one forget of the table.
pub fn observed_rows(batch: Duration, repeats: usize) -> Vec<Row> {
    const G: &str = "1 pair";
    let t = ObservedTable::new(1, &|_| Box::new(NullSink) as Box<dyn EventSink>);
    let r = Record {
        size: 512,
        kind: Kind::Malloc,
        flags: 0,
        stream: 0,
        stack: 0,
    };
    let mut pairs = |n: u64| {
        for i in 0..n {
            let a = 0x7f00_0000_0000 + (i & 1023) * 512;
            t.alloc(0, a, r);
            std::hint::black_box(t.free(a, 0, 0));
        }
    };
    let m = timing::median_ns_interleaved(
        batch,
        repeats,
        &mut [&mut pairs, &mut |n| engine::glibc_pairs(512, n)],
    );
    vec![Row::new(
        G,
        "observing: record + forget of one allocation (the table operation a call adds, no history)",
        m[0],
        "ns",
    )
    .baseline("glibc malloc+free", m[1])]
}

fn depth_ns(p: &ProcEnv, depth: u32, stacks: &str) -> Result<f64, String> {
    let script = cushim_tools::artifacts::source_root().join("examples/py_alloc_depth.py");
    let script = script.to_string_lossy().into_owned();
    let d = depth.to_string();
    let history = format!("enabled=all,stacks={stacks},max_frames=256");
    let out = p.run(
        std::path::Path::new("python3"),
        &[&script, &d, "20000", "5"],
        true,
        &[("CUSHIM_HISTORY", history.as_str())],
        Duration::from_secs(120),
    )?;
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("ns_per_pair="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("py_alloc_depth printed no figure: {out}"))
}

/// Per Python frame: the pair at depth 33 minus depth 1, `stacks=all` minus
/// `stacks=native` (so the native unwinding of the deeper stack is not counted), over 32
/// frames, divided by the 2 stacks a pair records (alloc and free). A difference of
/// differences: on a loaded machine it is noisy (it can even come out below zero).
pub fn python_rows(procs: &Result<ProcEnv, String>) -> Vec<Row> {
    const G: &str = "2 event";
    const NAME: &str = "Python frames: recording cost per Python frame (CPython via ctypes.PyDLL, stacks=all vs native)";
    let p = match procs {
        Ok(p) => p,
        Err(e) => return vec![Row::skipped(G, NAME, e.clone())],
    };
    // The four runs alternate, five rounds, median of each: load changes hit them alike.
    let configs = [(1, "native"), (1, "all"), (33, "native"), (33, "all")];
    let mut runs: [Vec<f64>; 4] = Default::default();
    for _ in 0..5 {
        for (i, (depth, stacks)) in configs.into_iter().enumerate() {
            match depth_ns(p, depth, stacks) {
                Ok(x) => runs[i].push(x),
                Err(e) => return vec![Row::skipped(G, NAME, e)],
            }
        }
    }
    let v: Vec<f64> = runs
        .iter_mut()
        .map(|r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
        .collect();
    let per_frame = ((v[3] - v[2]) - (v[1] - v[0])) / 32.0 / 2.0;
    vec![
        Row::new(G, NAME, per_frame, "ns"),
        Row::new(
            G,
            "Python: cudaMalloc+cudaFree pair at depth 33 with stacks=all",
            v[3],
            "ns",
        )
        .baseline("stacks=native", v[2]),
    ]
}
