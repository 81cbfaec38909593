//! Inputs for the analysis tests: the seed scenario recorded by the real engine, a PyTorch-shaped snapshot
//! pickle written by python3's own pickle module, an RMM log and an alloc/free log.
#![allow(dead_code)]

use cushim::alloc::CachingAllocator;
use cushim::config::alloc::parse;
use cushim::config::history::HistoryConf;
use cushim::snapshot::build::build;
use cushim::snapshot::model::{DeviceState, SnapshotInput};
use cushim::snapshot::{encode, Format};
use cushim::trace::event::NullSink;
use cushim::trace::intern::StackTable;
use cushim_testsupport::fake_device::FakeDevice;
use std::process::Command;
use std::sync::{Arc, Mutex};

// The engine tests' event sink (one vector of every event, shared by clones).
use super::engine_support::VecSink;

pub const MIB: u64 = 1 << 20;

/// Run `steps` on the engine under `conf` with every event recorded, and return the
/// snapshot (segments, trace, settings) in `format`.
pub fn engine_snapshot(
    conf: &str,
    format: Format,
    steps: impl FnOnce(&CachingAllocator),
) -> Vec<u8> {
    let dev = Arc::new(FakeDevice::new(1, 80 << 30));
    let (c, errs) = parse(conf);
    assert!(errs.is_empty(), "{errs:?}");
    let settings = c.settings_json();
    let sinks: Mutex<Vec<VecSink>> = Mutex::new(Vec::new());
    let a = CachingAllocator::new(dev, c, &|d| {
        if d < 0 {
            return Box::new(NullSink);
        }
        let s = VecSink::default();
        sinks.lock().unwrap().push(s.clone());
        Box::new(s)
    });
    steps(&a);
    let devices = a
        .snapshot()
        .into_iter()
        .filter(|d| d.device >= 0)
        .map(|d| DeviceState {
            device: d.device,
            segments: d.segments,
            events: d.events,
        })
        .collect();
    let input = SnapshotInput {
        devices,
        host: None,
        allocator_settings: settings,
        stats: serde_json::json!({}),
        history: HistoryConf::default(),
        cmdline: vec!["analysis-test".into()],
        ..Default::default()
    };
    encode(&build(&input, StackTable::global()), format).unwrap()
}

/// The design reference's seed scenario: 8 x 16 MiB, free all, 4 x 32 MiB.
pub fn seed_scenario(conf: &str, format: Format) -> Vec<u8> {
    engine_snapshot(conf, format, |a| {
        let p: Vec<u64> = (0..8)
            .map(|_| a.malloc(0, 16 * MIB, 0, 0).unwrap())
            .collect();
        for x in p {
            a.free(x, 0, 0).unwrap();
        }
        for _ in 0..4 {
            a.malloc(0, 32 * MIB, 0, 0).unwrap();
        }
    })
}

/// A snapshot shaped as `torch.cuda.memory._snapshot()` output, written by python3's pickle
/// module: stacks start with `torch::unwind::unwind` and c10 allocator frames, then the
/// program's Python frames; one block pending a free; `script` may adjust the dict `s`
/// before it is dumped. `None` when python3 is not installed.
pub fn torch_pickle(script: &str) -> Option<Vec<u8>> {
    let py = format!(
        r#"
import pickle, sys
MIB = 1 << 20
def frames(user):
    return [
        {{"name": "torch::unwind::unwind()", "filename": "??", "line": 0}},
        {{"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??", "line": 0}},
        {{"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", "filename": "??", "line": 0}},
        {{"name": "at::native::empty_cuda(c10::ArrayRef<long>)", "filename": "??", "line": 0}},
    ] + user
train = [{{"name": "train_step", "filename": "/home/u/train.py", "line": 42}},
         {{"name": "main", "filename": "/home/u/train.py", "line": 90}}]
load = [{{"name": "load_batch", "filename": "/home/u/data.py", "line": 7}},
        {{"name": "main", "filename": "/home/u/train.py", "line": 88}}]
ft, fl = frames(train), frames(load)
base = 0x7f0000000000
seg = {{"device": 0, "address": base, "total_size": 20 * MIB, "allocated_size": 12 * MIB,
       "active_size": 14 * MIB, "requested_size": 12 * MIB, "stream": 0,
       "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
       "frames": ft,
       "blocks": [
         {{"address": base, "size": 8 * MIB, "requested_size": 8 * MIB, "state": "active_allocated", "frames": ft}},
         {{"address": base + 8 * MIB, "size": 4 * MIB, "requested_size": 4 * MIB, "state": "active_allocated", "frames": fl}},
         {{"address": base + 12 * MIB, "size": 2 * MIB, "requested_size": 2 * MIB, "state": "active_pending_free", "frames": fl}},
         {{"address": base + 14 * MIB, "size": 6 * MIB, "requested_size": 0, "state": "inactive", "frames": []}},
       ]}}
trace = [
  {{"action": "segment_alloc", "addr": base, "size": 20 * MIB, "stream": 0, "time_us": 1, "frames": ft}},
  {{"action": "alloc", "addr": base, "size": 8 * MIB, "stream": 0, "time_us": 2, "frames": ft}},
  {{"action": "alloc", "addr": base + 8 * MIB, "size": 4 * MIB, "stream": 0, "time_us": 3, "frames": fl}},
  {{"action": "alloc", "addr": base + 12 * MIB, "size": 2 * MIB, "stream": 0, "time_us": 4, "frames": fl}},
  {{"action": "free_requested", "addr": base + 12 * MIB, "size": 2 * MIB, "stream": 0, "time_us": 5, "frames": fl}},
]
s = {{"segments": [seg], "device_traces": [trace, []],
     "allocator_settings": {{"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                            "garbage_collection_threshold": 0.0, "expandable_segments": False}}}}
{script}
sys.stdout.buffer.write(pickle.dumps(s, protocol=4))
"#
    );
    let out = Command::new("python3").arg("-c").arg(py).output().ok()?;
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

/// An RMM logging CSV.
pub fn rmm_csv() -> Vec<u8> {
    b"Thread,Time,Action,Pointer,Size,Stream\n\
      140,10:00:00.000001,allocate,0x7f0000000000,4194304,0x0\n\
      140,10:00:00.000002,allocate,0x7f0000400000,1048576,0x0\n\
      140,10:00:00.000003,free,0x7f0000000000,4194304,0x0\n\
      140,10:00:00.000004,allocate,0x7f0000800000,8388608,0x0\n"
        .to_vec()
}

/// An `alloc_time free_time size` log (allocatorSim's input format).
pub fn plain_log() -> Vec<u8> {
    b"0 5 4194304\n1 3 1048576\n2 -1 2097152\n4 6 8388608\n".to_vec()
}
