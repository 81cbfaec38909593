//! The reader accepts PyTorch's own snapshot pickles (written by Python's pickler at every
//! protocol, memo and framing included) and refuses anything that is not plain data.

use crate::common::snapshot_support as support;

use cushim::snapshot::value::Value;
use cushim::snapshot::{encode, Format};
use cushim_tools::snapshot::reader::{read_bytes, read_pickle};
use std::process::Command;
use std::sync::Arc;

/// A PyTorch-shaped snapshot made by Python, pickled at protocol `proto`; also as JSON.
const MAKE: &str = r#"
import json, pickle, sys
proto = int(sys.argv[1])
f1 = {"name": "main", "filename": "app.c", "line": 12}
f2 = {"name": "alloc_buffers", "filename": "app.c", "line": 40}
stack = [f2, f1]
seg = {"device": 0, "address": 140000000000000, "total_size": 2097152, "allocated_size": 1048576,
       "active_size": 1048576, "requested_size": 1000000, "stream": 0, "segment_type": "small",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": stack,
       "blocks": [{"address": 140000000000000, "size": 1048576, "requested_size": 1000000,
                   "state": "active_allocated", "frames": stack},
                  {"address": 140000001048576, "size": 1048576, "requested_size": 0,
                   "state": "inactive", "frames": []}]}
trace = [{"action": "segment_alloc", "addr": 140000000000000, "size": 2097152, "stream": 0,
          "time_us": 1700000000000000, "frames": stack}]
trace += [{"action": "alloc", "addr": 140000000000000, "size": 1000000, "stream": 0,
           "time_us": 1700000000000001 + i, "frames": stack} for i in range(1)]
trace += [{"action": "oom", "device_free": 5, "size": 1 << 40, "stream": 0, "time_us": 1700000000000100,
           "frames": []}]
snap = {"segments": [seg], "device_traces": [trace, []],
        "allocator_settings": {"max_split_size": -1, "roundup_power2_divisions": [1, 2], "ratio": 0.8,
                               "flag": True, "none": None, "big": 1 << 62, "neg": -(1 << 40),
                               "long_text": "x" * 300, "unicode": "m\u00e9moire \u2603"},
        "many": list(range(2500)), "d": {str(i): i for i in range(1500)}}
sys.stdout.buffer.write(pickle.dumps(snap, protocol=proto))
open(sys.argv[2], "w").write(json.dumps(snap))
"#;

fn normalize(v: &Value) -> Value {
    match v {
        Value::Tuple(t) | Value::List(t) => {
            Value::List(Arc::new(t.iter().map(normalize).collect()))
        }
        Value::Dict(d) => {
            let mut e: Vec<(Value, Value)> = d
                .iter()
                .map(|(k, x)| (normalize(k), normalize(x)))
                .collect();
            e.sort_by(|a, b| format!("{:?}", a.0).cmp(&format!("{:?}", b.0)));
            Value::dict(e)
        }
        other => other.clone(),
    }
}

fn python_pickle(proto: u32, test: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = support::scratch(&format!("reader-{test}-{proto}"));
    let json = dir.join("s.json");
    let out = Command::new("python3")
        .args(["-c", MAKE, &proto.to_string()])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.stdout, std::fs::read(json).unwrap())
}

#[test]
fn python_pickles_of_every_protocol_read_as_their_json() {
    for proto in 0..=5 {
        let (pkl, json) = python_pickle(proto, "all");
        let got = read_pickle(&pkl).unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        let want = read_bytes(&json).unwrap();
        assert!(
            normalize(&got) == normalize(&want),
            "protocol {proto} differs"
        );
        let seg = &got.get("segments").unwrap().as_seq().unwrap()[0];
        if proto >= 2 {
            assert!(matches!(seg.get("segment_pool_id"), Some(Value::Tuple(_))));
        }
    }
}

#[test]
fn memo_references_become_shared_nodes() {
    let (pkl, _) = python_pickle(4, "memo");
    let v = read_pickle(&pkl).unwrap();
    let seg = &v.get("segments").unwrap().as_seq().unwrap()[0];
    let (Some(Value::List(a)), Some(Value::List(b))) = (
        seg.get("frames"),
        seg.get("blocks").unwrap().as_seq().unwrap()[0].get("frames"),
    ) else {
        panic!("frames are lists")
    };
    assert!(Arc::ptr_eq(a, b), "one stack object, referenced twice");
    // Writing it again keeps the sharing: the frames appear once in our pickle.
    let again = encode(&v, Format::Pickle).unwrap();
    let hits = again.windows(13).filter(|w| w == b"alloc_buffers").count();
    assert_eq!(hits, 1);
}

#[test]
fn non_plain_data_and_broken_pickles_are_refused_with_a_reason() {
    let out = Command::new("python3")
        .args(["-c", "import pickle,sys,datetime; sys.stdout.buffer.write(pickle.dumps(datetime.date(2020,1,1), protocol=4))"])
        .output()
        .unwrap();
    let e = read_pickle(&out.stdout).unwrap_err();
    assert!(e.contains("not plain data"), "{e}");
    let (pkl, _) = python_pickle(4, "refuse");
    assert!(read_pickle(&pkl[..pkl.len() / 2])
        .unwrap_err()
        .contains("truncated"));
    let big = Command::new("python3")
        .args([
            "-c",
            "import pickle,sys; sys.stdout.buffer.write(pickle.dumps(1 << 70, protocol=4))",
        ])
        .output()
        .unwrap();
    assert!(read_pickle(&big.stdout).unwrap_err().contains("64 bits"));
    assert!(read_pickle(b"").is_err());
}

#[test]
fn an_unsigned_64_bit_integer_reads_as_its_64_bits() {
    // PyTorch writes a frame's unknown line as size_t(-1): 2**64 - 1, nine bytes pickled.
    let out = Command::new("python3")
        .args([
            "-c",
            "import pickle,sys; sys.stdout.buffer.write(pickle.dumps({'line': (1 << 64) - 1}, protocol=4))",
        ])
        .output()
        .unwrap();
    let v = read_pickle(&out.stdout).unwrap();
    assert_eq!(v.get("line"), Some(&Value::Int(-1)));
}

#[test]
fn msgpack_with_bytes_after_its_value_is_refused_not_read_as_a_number() {
    // Plain text starts with a positive fixint: without the check, "hello world" read as 104.
    // A msgpack snapshot starts with a map, so text is refused as what it is.
    let err = read_bytes(b"hello world\n").expect_err("text accepted as msgpack");
    assert!(
        err.contains("not a snapshot (found text starting \"hello world\")"),
        "{err}"
    );
    // A valid msgpack map followed by garbage is refused too; the map alone reads.
    let map = [0x81u8, 0xa1, b'a', 0x01];
    assert!(read_bytes(&map).is_ok());
    let mut tail = map.to_vec();
    tail.push(0x00);
    let err = read_bytes(&tail).expect_err("trailing byte accepted");
    assert!(err.contains("1 bytes after the first value"), "{err}");
}

/// Takes every dict with key `a` (numbering them), and names a list of taken entries by
/// its run.
struct Taker(i64);

impl cushim_tools::snapshot::reader::Hook for Taker {
    fn dict(&mut self, v: Value) -> Value {
        if v.get("a").is_none() {
            return v;
        }
        self.0 += 1;
        Value::Int(self.0 - 1)
    }
    fn taken_list(&mut self, first: i64, n: u64) -> Value {
        Value::str(&format!("run {first}+{n}"))
    }
}

#[test]
fn a_list_of_taken_entries_is_kept_as_one_run_and_anything_else_as_what_it_holds() {
    let entry = |p: &mut Vec<u8>| p.extend_from_slice(b"}\x94\x8c\x01aK\x00s");
    let mut p = b"\x80\x04}\x94".to_vec();
    // x: two batches of taken entries (one run across APPENDS); y: x again via the memo.
    p.extend_from_slice(b"\x8c\x01x]q\x01(");
    (0..3).for_each(|_| entry(&mut p));
    p.extend_from_slice(b"e(");
    (0..2).for_each(|_| entry(&mut p));
    p.extend_from_slice(b"es\x8c\x01yh\x01s");
    // z: taken entries mixed with a plain integer: written out as integers.
    p.extend_from_slice(b"\x8c\x01z](");
    entry(&mut p);
    p.extend_from_slice(b"K\x09");
    entry(&mut p);
    p.extend_from_slice(b"es");
    // w: a run whose open list is fetched from the memo (appended to itself).
    p.extend_from_slice(b"\x8c\x01w]q\xc8(");
    entry(&mut p);
    p.extend_from_slice(b"eh\xc8as.");
    let v = cushim_tools::snapshot::reader::read_pickle_with(&p, &mut Taker(0)).expect("reads");
    assert_eq!(v.get("x").and_then(Value::as_str), Some("run 0+5"));
    assert_eq!(v.get("y").and_then(Value::as_str), Some("run 0+5"));
    let z: Vec<i64> = v
        .get("z")
        .and_then(Value::as_seq)
        .expect("z")
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    assert_eq!(z, [5, 9, 6]);
    let w = v.get("w").and_then(Value::as_seq).expect("w");
    assert_eq!(w.len(), 2);
    assert_eq!(w[0].as_i64(), Some(7));
}
