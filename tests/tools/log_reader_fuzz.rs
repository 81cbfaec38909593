//! The event log reader on damaged input: every truncation gives the clean prefix (or, inside
//! the header, one error), every corruption gives a clean prefix or one error; never a
//! panic, never an event that was not written.

use cushim::trace::event::{Action, TraceEvent};
use cushim::trace::log::codec::EventEncoder;
use cushim::trace::log::format::{self, kind, put_varint, MAGIC};
use cushim_tools::snapshot::log_reader::{read_log, LogFrame, LogVisitor};

#[derive(Default)]
struct Collect(Vec<TraceEvent>);

impl LogVisitor for Collect {
    fn event(&mut self, ev: TraceEvent) {
        self.0.push(ev);
    }
    fn frame(&mut self, _id: u64, _f: LogFrame) {}
    fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
}

fn ev(i: u64) -> TraceEvent {
    TraceEvent {
        action: Action::ALL[(i % 5) as usize],
        device: (i % 2) as i32,
        addr: 0x7000_0000 + (i % 97) * 4096,
        size: 512 * (1 + i % 13),
        stream: i % 3,
        time_us: 1_000_000 + i as i64 * 7,
        stack: (i % 4) as u32,
        device_free: 0,
        range: (i / 7 % 3) as u32,
    }
}

fn varint(out: &mut Vec<u8>, v: u64) {
    let mut b = [0u8; 10];
    let n = put_varint(&mut b, 0, v);
    out.extend_from_slice(&b[..n]);
}

/// A log of `chunks` event chunks of `per` events, with frames, stacks and an end.
fn log(chunks: u64, per: u64) -> (Vec<u8>, Vec<TraceEvent>) {
    let mut out = MAGIC.to_vec();
    let mut c = Vec::new();
    let header = format!(r#"{{"version":{},"pid":1}}"#, format::VERSION);
    format::chunk(kind::HEADER, header.as_bytes(), &mut c);
    out.extend_from_slice(&c);
    let mut frames = Vec::new();
    for id in 0..3u64 {
        varint(&mut frames, id);
        for s in ["name", "file.c"] {
            varint(&mut frames, s.len() as u64);
            frames.extend_from_slice(s.as_bytes());
        }
        varint(&mut frames, 10 + id);
    }
    format::chunk(kind::FRAMES, &frames, &mut c);
    out.extend_from_slice(&c);
    let mut all = Vec::new();
    let mut payload = vec![0u8; 1 << 16];
    for k in 0..chunks {
        let mut enc = EventEncoder::new();
        let mut pos = 0;
        for i in 0..per {
            let e = ev(k * per + i);
            pos = enc.put(&e, &mut payload, pos).expect("room");
            all.push(e);
        }
        format::chunk(kind::EVENTS, &payload[..pos], &mut c);
        out.extend_from_slice(&c);
    }
    let mut end = Vec::new();
    varint(&mut end, all.len() as u64);
    format::chunk(kind::END, &end, &mut c);
    out.extend_from_slice(&c);
    (out, all)
}

#[test]
fn every_truncation_reads_a_clean_prefix_or_fails_in_the_header() {
    let (bytes, all) = log(6, 40);
    let mut full = Collect::default();
    let info = read_log(&bytes, &mut full).expect("the whole log reads");
    assert!(info.ended && info.problem.is_none());
    assert_eq!(full.0, all);
    let mut last = 0;
    for cut in 0..bytes.len() {
        let mut c = Collect::default();
        match read_log(&bytes[..cut], &mut c) {
            Ok(info) => {
                // A cut between chunks is clean but lacks the END chunk; inside one, it is
                // reported.
                assert!(!info.ended, "cut {cut}");
                assert_eq!(&c.0[..], &all[..c.0.len()], "cut {cut}: a prefix");
                assert!(
                    c.0.len() >= last,
                    "cut {cut}: a longer file never gives fewer events"
                );
                last = c.0.len();
            }
            Err(e) => assert!(c.0.is_empty() && !e.is_empty(), "cut {cut}"),
        }
    }
    assert_eq!(last, all.len(), "the cut before END holds every event");
}

#[test]
fn corrupted_bytes_give_a_clean_prefix_or_one_error_never_a_panic() {
    let (bytes, all) = log(8, 50);
    let mut rng = fastrand::Rng::with_seed(20);
    for round in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + round % 4 {
            let i = rng.usize(..b.len());
            b[i] ^= 1 << rng.u8(..8);
        }
        if round % 7 == 0 {
            let cut = rng.usize(..b.len());
            b.truncate(cut);
        }
        let mut c = Collect::default();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_log(&b, &mut c)));
        let r = r.unwrap_or_else(|_| panic!("round {round}: the reader panicked"));
        // A flipped bit is caught by the checksum: what was read is what was written.
        if r.is_ok() {
            assert_eq!(&c.0[..], &all[..c.0.len()], "round {round}");
        }
    }
}

#[test]
fn damaged_log_files_model_a_clean_prefix_or_fail_and_every_walk_agrees() {
    // The analyses' path: the file is read once, then its events are read again on every
    // walk (forward and backward) from the file.
    let (bytes, all) = log(8, 50);
    let dir = std::env::temp_dir().join(format!("cushim-logfuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let path = dir.join("fuzz.log");
    let mut rng = fastrand::Rng::with_seed(21);
    for round in 0..400 {
        let mut b = bytes.clone();
        if round > 0 {
            for _ in 0..round % 3 {
                let i = rng.usize(..b.len());
                b[i] ^= 1 << rng.u8(..8);
            }
            if round % 2 == 0 {
                let cut = rng.usize(..b.len());
                b.truncate(cut);
            }
        }
        std::fs::write(&path, &b).expect("writing the damaged log");
        let r = std::panic::catch_unwind(|| {
            let snap = cushim_tools::analyze::input::read(&path)?;
            // The walk made while reading agrees with the walk of the model read alone.
            let (again, walks) = cushim_tools::analyze::input::read_walked(&path)?;
            let walks = walks.expect("a log is walked while it is read");
            assert_eq!(again.devices.len(), snap.devices.len(), "round {round}");
            for (d, w) in again.devices.iter().zip(&walks) {
                let sep = cushim_tools::analyze::walk::walk(&again, d);
                let facts = |w: &cushim_tools::analyze::walk::Walked| {
                    let t = (w.timeline.clone(), w.per, w.ooms.clone(), w.largest_request);
                    (w.peaks, t, w.end.allocated_bytes, w.end.pending_bytes)
                };
                assert_eq!(facts(w), facts(&sep), "round {round}: device {}", d.ordinal);
            }
            let mut walked = 0;
            for d in snap.devices.iter().chain(snap.host.iter()) {
                let fwd: Vec<_> = d.events.iter().collect();
                let mut back: Vec<_> = d.events.iter().rev().collect();
                back.reverse();
                assert_eq!(fwd.len(), d.events.len(), "round {round}");
                assert_eq!(fwd, back, "round {round}: both directions agree");
                // A walk from the middle, backward, as the analyses make one.
                let mid = d.events.len() / 2;
                let tail: Vec<_> = d.events.iter().skip(mid).rev().collect();
                assert_eq!(tail.len(), d.events.len() - mid, "round {round}");
                let want = all
                    .iter()
                    .filter(|e| i64::from(e.device) == d.ordinal)
                    .take(fwd.len());
                for (got, e) in fwd.iter().zip(want) {
                    assert_eq!((got.action, got.addr, got.size), (e.action, e.addr, e.size));
                }
                walked += fwd.len();
            }
            Ok::<usize, String>(walked)
        });
        match r {
            Ok(Ok(n)) => {
                assert!(n <= all.len(), "round {round}");
                assert!(round > 0 || n == all.len(), "the whole log: {n}");
            }
            Ok(Err(e)) => assert!(round > 0 && !e.is_empty(), "round {round}: {e}"),
            Err(_) => panic!("round {round}: reading or walking panicked"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
