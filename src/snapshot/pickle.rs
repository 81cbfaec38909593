//! The pickle writer: protocol 4 in the restricted dialect PyTorch's viewers unpickle.
//!
//! Hand-written because no crate writes this dialect: only dict/list/tuple/str/int/float/
//! bool/None; objects shared in the tree (frames, frame lists, keys) are written once,
//! memoized (MEMOIZE) and referenced again with BINGET/LONG_BINGET; list and dict items go
//! in APPENDS/SETITEMS batches of at most 1000; integers are int64 (LONG1 of <= 8 bytes);
//! never protocol 5 opcodes, and no FRAME opcodes (framing is optional in protocol 4).
//!
//! Invariant: the output unpickles (Python's `pickle.loads`, our reader) to a tree equal
//! to the input, with each shared node (same `Arc`) appearing as one shared object.

use crate::snapshot::events::EventList;
use crate::snapshot::value::Value;
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const EMPTY_TUPLE: u8 = b')';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const TUPLE: u8 = b't';
const MARK: u8 = b'(';
const APPEND: u8 = b'a';
const APPENDS: u8 = b'e';
const SETITEM: u8 = b's';
const SETITEMS: u8 = b'u';
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Most items per APPENDS / SETITEMS batch.
pub const BATCH: usize = 1000;

struct Writer<'w> {
    out: Vec<u8>,
    memo: HashMap<usize, u32>,
    next: u32,
    /// Where full buffers go (None: everything stays in `out`).
    sink: Option<&'w mut dyn Write>,
    error: Option<std::io::Error>,
}

/// Buffer size at which a streaming writer hands bytes to its sink.
const FLUSH_AT: usize = 1 << 20;

/// Identity of a shared node: its `Arc`'s address, if more than one reference exists.
fn shared_id(v: &Value) -> Option<usize> {
    fn id<T: ?Sized>(a: &Arc<T>) -> Option<usize> {
        (Arc::strong_count(a) > 1).then_some(Arc::as_ptr(a) as *const u8 as usize)
    }
    match v {
        Value::Str(s) => id(s),
        Value::List(l) | Value::Tuple(l) => id(l),
        Value::Dict(d) => id(d),
        _ => None,
    }
}

impl Writer<'_> {
    /// Hand the buffer to the sink once it is large (between items, never mid-opcode).
    fn maybe_flush(&mut self) {
        if self.out.len() < FLUSH_AT || self.error.is_some() {
            return;
        }
        if let Some(sink) = self.sink.as_mut() {
            if let Err(e) = sink.write_all(&self.out) {
                self.error = Some(e);
            }
            self.out.clear();
        }
    }

    fn get(&mut self, idx: u32) {
        if let Ok(small) = u8::try_from(idx) {
            self.out.extend_from_slice(&[BINGET, small]);
        } else {
            self.out.push(LONG_BINGET);
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
    }

    fn memoize(&mut self, key: Option<usize>) {
        if let Some(k) = key {
            self.out.push(MEMOIZE);
            self.memo.insert(k, self.next);
            self.next += 1;
        }
    }

    fn int(&mut self, i: i64) {
        if (0..=0xff).contains(&i) {
            self.out.extend_from_slice(&[BININT1, i as u8]);
        } else if (0..=0xffff).contains(&i) {
            self.out.push(BININT2);
            self.out.extend_from_slice(&(i as u16).to_le_bytes());
        } else if let Ok(i32v) = i32::try_from(i) {
            self.out.push(BININT);
            self.out.extend_from_slice(&i32v.to_le_bytes());
        } else {
            // Minimal two's-complement little-endian bytes.
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let below_sign = bytes[n - 2] & 0x80;
                if (top == 0 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn string(&mut self, s: &str) {
        let b = s.as_bytes();
        if let Ok(n) = u8::try_from(b.len()) {
            self.out.extend_from_slice(&[SHORT_BINUNICODE, n]);
        } else if let Ok(n) = u32::try_from(b.len()) {
            self.out.push(BINUNICODE);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            self.out.push(BINUNICODE8);
            self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        }
        self.out.extend_from_slice(b);
    }

    /// A key or name string of an event list: memoized even when only the list holds it.
    fn shared_str(&mut self, v: &Value) {
        let Value::Str(s) = v else {
            return self.value(v);
        };
        let k = Arc::as_ptr(s) as *const u8 as usize;
        if let Some(&idx) = self.memo.get(&k) {
            return self.get(idx);
        }
        self.string(s);
        self.memoize(Some(k));
    }

    fn events(&mut self, list: &EventList) {
        self.out.push(EMPTY_LIST);
        let mut i = 0;
        while i < list.len() {
            let end = (i + BATCH).min(list.len());
            self.out.push(MARK);
            for j in i..end {
                self.out.extend_from_slice(&[EMPTY_DICT, MARK]);
                for (k, v) in list.pairs(j) {
                    self.shared_str(k);
                    match &v {
                        Value::Str(_) => self.shared_str(&v),
                        _ => self.value(&v),
                    }
                }
                self.out.push(SETITEMS);
            }
            self.out.push(APPENDS);
            self.maybe_flush();
            i = end;
        }
    }

    fn value(&mut self, v: &Value) {
        let key = shared_id(v);
        if let Some(k) = key {
            if let Some(&idx) = self.memo.get(&k) {
                self.get(idx);
                return;
            }
        }
        match v {
            Value::Events(list) => self.events(list),
            Value::None => self.out.push(NONE),
            Value::Bool(b) => self.out.push(if *b { NEWTRUE } else { NEWFALSE }),
            Value::Int(i) => self.int(*i),
            Value::Float(f) => {
                self.out.push(BINFLOAT);
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => {
                self.string(s);
                self.memoize(key);
            }
            Value::List(items) => {
                self.out.push(EMPTY_LIST);
                self.memoize(key);
                for chunk in items.chunks(BATCH) {
                    if chunk.len() == 1 {
                        self.value(&chunk[0]);
                        self.out.push(APPEND);
                    } else {
                        self.out.push(MARK);
                        chunk.iter().for_each(|x| self.value(x));
                        self.out.push(APPENDS);
                        self.maybe_flush();
                    }
                }
            }
            Value::Dict(entries) => {
                self.out.push(EMPTY_DICT);
                self.memoize(key);
                for chunk in entries.chunks(BATCH) {
                    if chunk.len() == 1 {
                        self.value(&chunk[0].0);
                        self.value(&chunk[0].1);
                        self.out.push(SETITEM);
                    } else {
                        self.out.push(MARK);
                        for (k, x) in chunk {
                            self.value(k);
                            self.value(x);
                        }
                        self.out.push(SETITEMS);
                    }
                }
            }
            Value::Tuple(items) => {
                match items.len() {
                    0 => self.out.push(EMPTY_TUPLE),
                    1..=3 => {
                        items.iter().for_each(|x| self.value(x));
                        self.out.push([TUPLE1, TUPLE2, TUPLE3][items.len() - 1]);
                    }
                    _ => {
                        self.out.push(MARK);
                        items.iter().for_each(|x| self.value(x));
                        self.out.push(TUPLE);
                    }
                }
                self.memoize(key);
            }
        }
    }
}

/// Encode `v` as a protocol-4 pickle.
pub fn to_bytes(v: &Value) -> Vec<u8> {
    let mut w = Writer {
        out: Vec::with_capacity(1 << 16),
        memo: HashMap::new(),
        next: 0,
        sink: None,
        error: None,
    };
    w.out.extend_from_slice(&[PROTO, 4]);
    w.value(v);
    w.out.push(STOP);
    w.out
}

/// Stream `v` as a protocol-4 pickle into `sink`, about 1 MiB at a time.
pub fn write_to(v: &Value, sink: &mut dyn Write) -> std::io::Result<()> {
    let mut w = Writer {
        out: Vec::with_capacity(FLUSH_AT + (1 << 16)),
        memo: HashMap::new(),
        next: 0,
        sink: Some(sink),
        error: None,
    };
    w.out.extend_from_slice(&[PROTO, 4]);
    w.value(v);
    w.out.push(STOP);
    if let Some(e) = w.error.take() {
        return Err(e);
    }
    let rest = std::mem::take(&mut w.out);
    match w.sink.take() {
        Some(sink) => sink.write_all(&rest),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_use_the_smallest_opcode_and_stay_int64() {
        let enc = |i| {
            let mut w = Writer {
                out: Vec::new(),
                memo: HashMap::new(),
                next: 0,
                sink: None,
                error: None,
            };
            w.int(i);
            w.out
        };
        assert_eq!(enc(5), vec![BININT1, 5]);
        assert_eq!(enc(300), vec![BININT2, 0x2c, 1]);
        assert_eq!(enc(-1), vec![BININT, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(enc(1 << 31), vec![LONG1, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(
            enc(i64::MIN),
            [vec![LONG1, 8], i64::MIN.to_le_bytes().to_vec()].concat()
        );
        assert_eq!(enc(-(1 << 40)), vec![LONG1, 6, 0, 0, 0, 0, 0, 0xff]);
    }

    #[test]
    fn shared_nodes_are_written_once() {
        let frame = Value::dict(vec![(
            Value::str("name"),
            Value::str("f".repeat(100).as_str()),
        )]);
        let list = Value::list(vec![frame.clone(); 50]);
        let once = to_bytes(&Value::list(vec![list.clone()])).len();
        let many = to_bytes(&Value::list(vec![list.clone(); 1000])).len();
        assert!(many < once + 1000 * 6, "{once} {many}");
    }

    #[test]
    fn streaming_output_equals_the_buffered_one() {
        let big: Vec<Value> = (0..300_000).map(|i| Value::Int(i * 1_000_003)).collect();
        let v = Value::dict(vec![(Value::str("xs"), Value::list(big))]);
        let mut streamed = Vec::new();
        write_to(&v, &mut streamed).unwrap();
        assert!(streamed.len() > FLUSH_AT, "large enough to flush mid-way");
        assert_eq!(streamed, to_bytes(&v));
    }

    #[test]
    fn no_batch_exceeds_1000_items() {
        let v = Value::list((0..2500).map(|_| Value::None).collect());
        let b = to_bytes(&v);
        let marks = b.iter().filter(|&&c| c == MARK).count();
        assert_eq!(marks, 3);
    }
}
