#!/usr/bin/env python3
"""Run every offline `cushim` command on each PyTorch memory snapshot of a directory and
check what must hold on real files; print one table row per file and the violations.

usage: real_sweep.py DIR [--cushim PATH] [--no-fit-probe] [--only SUBSTRING]

DIR holds snapshots (*.pickle, *.pkl, optionally gzip'd as *.gz). Nothing of anyone's data
lives in this script: it reads the files it is given and computes its own expectations
from them with the Python standard library (plus `jsonschema` for the schema checks).

Checks per file (a violation is printed as `FILE: CHECK: what`):
  exit      every command exits 0 or 1 (fit may exit 1); 2 only with one stderr line;
            never a panic
  schema    every --json output validates against docs/json/*.schema.json
  cats      summary --by category: the categories sum to the moment's allocated bytes,
            which equal summary's peak_allocated_bytes
  before    before_recording_bytes is at most the bytes of the blocks live when the trace
            began and still held at the moment (computed here by undoing the trace from
            the segments: those whose own frames give no category), and at most the
            "before the recording / no stack" category's bytes
  adam      at the end of a trace whose last phase is an Adam/AdamW step, optimizer state
            is twice the gradients
  replay    replay's recorded-settings row peaks within 1% of the recorded peak reserved
  fit       fit's recorded-settings size lies in [peak allocated, recorded peak reserved]
            (unless the recording ran out of memory); replay at that size has no OOM, at
            2 MiB less it has one
  convert   .json and back to .pickle: the same summary
  report    writes an HTML file
Columns: peak allocated and recorded reserved (MiB), replay error %, fit (MiB), categories
ok, the wall time of `fit` (s).
"""
import argparse
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCHEMAS = os.path.join(ROOT, "docs", "json")
MIB = 1 << 20
STEP = 2 * MIB


def load_snapshot(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return pickle.load(f)


def start_bytes(snap, upto=None):
    """Per device: bytes of the blocks live when the trace began and still held after
    `upto[device]` events (all of them live at the start without `upto`). A block live at
    the end (per segments) or freed in the trace, whose address the trace did not allocate
    first, was live at the start; it stops being held when the program frees it
    (free_requested, or free_completed in traces without requests); a block pending its
    free at the end is not held at the end (the program freed it)."""
    out = {}
    traces = snap.get("device_traces") or []
    live_end = {}
    pending_end = {}
    for seg in snap.get("segments", []):
        dev = seg.get("device", 0)
        addr = seg["address"]
        for b in seg.get("blocks", []):
            if b["state"] in ("active_allocated", "active_pending_free"):
                live_end.setdefault(dev, {})[addr] = b["size"]
            if b["state"] == "active_pending_free":
                pending_end.setdefault(dev, set()).add(addr)
            addr += b["size"]
    devices = set(live_end) | {i for i, t in enumerate(traces) if t}
    for dev in devices:
        trace = traces[dev] if dev < len(traces) else []
        seen = set()
        pre = {}
        for e in trace:
            a = e.get("addr")
            if e["action"] == "alloc":
                seen.add(a)
            elif e["action"] in ("free_requested", "free_completed") and a not in seen:
                pre[a] = e["size"]
                seen.add(a)
        for a, size in live_end.get(dev, {}).items():
            if a not in seen:
                pre[a] = size
        held = dict(pre)
        if upto is not None and upto.get(dev, len(trace)) >= len(trace):
            # At the end, a block pending its free was freed by the program (after the
            # trace, or with no trace): live at the start, no longer held.
            for a in pending_end.get(dev, set()) - seen:
                held.pop(a, None)
        if upto is not None:
            for e in trace[: upto.get(dev, len(trace))]:
                if e["action"] in ("free_requested", "free_completed") and e.get("addr") in held:
                    del held[e["addr"]]
                elif e["action"] == "alloc":
                    held.pop(e.get("addr"), None)
        out[dev] = sum(held.values())
    return out


def ran_out(snap):
    """The devices whose trace records an out-of-memory."""
    return {i for i, t in enumerate(snap.get("device_traces") or []) if any(e["action"] == "oom" for e in t)}


def has_adam(snap):
    for t in snap.get("device_traces") or []:
        for e in t:
            for fr in e.get("frames") or []:
                name = (fr.get("name") or "") + (fr.get("filename") or "")
                if "adam" in name.lower():
                    return True
    return False


class Sweep:
    def __init__(self, cushim, fit_probe):
        self.cushim = cushim
        self.fit_probe = fit_probe
        self.violations = []
        self.schemas = {}
        try:
            import jsonschema  # noqa: F401

            self.jsonschema = jsonschema
        except ImportError:
            self.jsonschema = None

    def bad(self, name, check, what):
        self.violations.append(f"{name}: {check}: {what}")

    def run(self, name, args, ok=(0,)):
        t0 = time.monotonic()
        p = subprocess.run([self.cushim] + args, capture_output=True, text=True)
        dt = time.monotonic() - t0
        err = p.stderr.strip()
        if "panicked" in err or p.returncode not in (0, 1, 2):
            self.bad(name, "exit", f"{' '.join(args[:2])}: status {p.returncode}: {err[-300:]}")
        elif p.returncode == 2 and len(err.splitlines()) != 1:
            self.bad(name, "exit", f"{' '.join(args[:2])}: status 2 with {len(err.splitlines())} lines")
        elif p.returncode not in ok:
            self.bad(name, "exit", f"{' '.join(args[:2])}: status {p.returncode}: {err[-300:]}")
        return p, dt

    def json_of(self, name, args, schema, ok=(0,)):
        p, dt = self.run(name, args + ["--json"], ok)
        if p.returncode not in ok or (p.returncode != 0 and not p.stdout.strip()):
            return None, dt
        try:
            doc = json.loads(p.stdout)
        except ValueError as e:
            self.bad(name, "schema", f"{args[0]}: not JSON: {e}")
            return None, dt
        if self.jsonschema is not None and schema:
            if schema not in self.schemas:
                with open(os.path.join(SCHEMAS, schema)) as f:
                    self.schemas[schema] = json.load(f)
            try:
                self.jsonschema.validate(doc, self.schemas[schema])
            except self.jsonschema.ValidationError as e:
                self.bad(name, "schema", f"{' '.join(args[:3])}: {e.message[:200]} at {list(e.path)}")
        return doc, dt

    def file(self, path, tmp):
        name = os.path.basename(path)
        row = {"file": name}
        src = path
        if path.endswith(".gz"):
            src = os.path.join(tmp, name[:-3])
            with gzip.open(path, "rb") as f, open(src, "wb") as g:
                shutil.copyfileobj(f, g)
        try:
            snap = load_snapshot(src)
        except Exception as e:  # noqa: BLE001 - any unreadable file is reported, not fatal
            row["note"] = f"not a pickle: {type(e).__name__}"
            return row
        oom = ran_out(snap)
        summ, _ = self.json_of(name, ["summary", src], "summary.schema.json")
        if summ is None:
            row["note"] = "summary failed"
            return row
        self.json_of(name, ["summary", "--by", "range", src], "summary-by-range.schema.json")
        self.run(name, ["summary", "--depth", "3", "--tree", src])
        cats, _ = self.json_of(name, ["summary", "--by", "category", src], "summary-by-category.schema.json")
        devs = {d["device"]: d for d in summ["devices"]}
        row["peak"] = sum(d.get("peak_allocated_bytes") or 0 for d in devs.values())
        row["reserved"] = sum(d.get("peak_reserved_bytes") or 0 for d in devs.values())
        row["cats"] = "-"
        starts = start_bytes(snap)
        if cats is not None:
            ok = True
            for d in cats["devices"]:
                dev = d["device"]
                total = sum(c["bytes"] for c in d.get("categories") or [])
                if not d.get("categories"):
                    continue
                if total != d["allocated_bytes"]:
                    ok = False
                    self.bad(name, "cats", f"device {dev}: categories sum {total} != allocated {d['allocated_bytes']}")
                peak = (devs.get(dev) or {}).get("peak_allocated_bytes")
                if peak is not None and d["allocated_bytes"] != peak:
                    ok = False
                    self.bad(name, "cats", f"device {dev}: at the peak {d['allocated_bytes']} != summary peak {peak}")
                want = start_bytes(snap, {dev: d["after_event"]}).get(dev)
                got = d.get("before_recording_bytes")
                row_before = next((c["bytes"] for c in d.get("categories") or []
                                   if c["category"] == "before the recording / no stack"), 0)
                if want is not None and got is not None and (got > want or got > row_before):
                    ok = False
                    self.bad(name, "before", f"device {dev}: before_recording_bytes {got} > live since the start {want} (of {starts.get(dev)} at the start) or > its category's {row_before}")
            row["cats"] = "ok" if ok else "NO"
            if has_adam(snap):
                end, _ = self.json_of(name, ["summary", "--by", "category", "--at", "end", src], "summary-by-category.schema.json")
                for d in (end or {}).get("devices", []):
                    phases = d.get("phases") or []
                    by = {c["category"]: c["bytes"] for c in d.get("categories") or []}
                    g, o = by.get("gradients", 0), by.get("optimizer state", 0)
                    # zero_grad(set_to_none=True) after the step frees the gradients: no ratio then
                    freed = g * 100 < o
                    if phases and phases[-1]["phase"] == "optimizer" and g and not freed and o != 2 * g:
                        self.bad(name, "adam", f"device {d['device']}: optimizer state {o} != 2 x gradients {g}")
        # Without a trace, replay, fit and export refuse (status 2, one line): nothing to replay.
        traced = any(snap.get("device_traces") or [])
        ok2 = () if traced else (2,)
        rep, _ = self.json_of(name, ["replay", src], "replay.schema.json", ok=(0,) + ok2)
        fit, fit_s = self.json_of(name, ["fit", src], "fit.schema.json", ok=(0, 1) + ok2)
        row["fit_s"] = fit_s
        errs, fits = [], []
        for d in (rep or {}).get("devices", []):
            rows = d.get("rows") or []
            rec = next((r for r in rows if r.get("recorded")), None)
            first = next((r for r in rows if not r.get("recorded")), None)
            if rec and first and rec.get("peak_reserved_bytes"):
                e = 100.0 * (first["peak_reserved_bytes"] - rec["peak_reserved_bytes"]) / rec["peak_reserved_bytes"]
                errs.append(e)
                if abs(e) > 1.0:
                    self.bad(name, "replay", f"device {d['device']}: recorded-settings replay peaks {first['peak_reserved_bytes']} vs recorded {rec['peak_reserved_bytes']} ({e:+.2f}%)")
        row["err"] = max(errs, key=abs) if errs else None
        for d in (fit or {}).get("devices", []):
            conf = next((c for c in d.get("configurations") or [] if c.get("recorded")), None)
            if not conf or conf.get("min_device_bytes") is None:
                continue
            size = conf["min_device_bytes"]
            fits.append(size)
            lo, hi = d.get("peak_allocated_bytes"), d.get("recorded_peak_reserved_bytes")
            if d["device"] not in oom and lo is not None and hi is not None and not (lo <= size <= hi):
                self.bad(name, "fit", f"device {d['device']}: fit {size} outside [peak allocated {lo}, recorded reserved {hi}]")
            if self.fit_probe and len(fit.get("devices", [])) == 1:
                for at, want_oom in ((size, False), (size - STEP, True)):
                    r, _ = self.json_of(name, ["replay", "--device-memory", str(at), src], "replay.schema.json")
                    for rd in (r or {}).get("devices", []):
                        first = next((x for x in rd.get("rows") or [] if not x.get("recorded")), None)
                        if first is None:
                            continue
                        got_oom = (first.get("ooms") or 0) > 0
                        if got_oom != want_oom:
                            self.bad(name, "fit", f"device {rd['device']}: replay at {at} {'has' if got_oom else 'has no'} OOM (fit said {size})")
        row["fit"] = sum(fits) if fits else None
        js = os.path.join(tmp, "c.json")
        back = os.path.join(tmp, "c.pickle")
        p1, _ = self.run(name, ["convert", src, js])
        p2, _ = self.run(name, ["convert", js, back])
        if p1.returncode == 0 and p2.returncode == 0:
            a, _ = self.json_of(name, ["summary", js], "summary.schema.json")
            b, _ = self.json_of(name, ["summary", back], "summary.schema.json")
            strip = lambda s: [{k: v for k, v in d.items() if k != "file"} for d in (s or {}).get("devices", [])]
            if strip(a) != strip(summ) or strip(b) != strip(summ):
                self.bad(name, "convert", "summary differs after .json and back")
        html = os.path.join(tmp, "r.html")
        p, _ = self.run(name, ["report", "-o", html, src])
        if p.returncode == 0:
            with open(html, "rb") as f:
                if b"<html" not in f.read(4096).lower():
                    self.bad(name, "report", "no <html> in the report")
        self.json_of(name, ["diff", src, back if os.path.exists(back) else src], "diff.schema.json")
        pq = os.path.join(tmp, "pq")
        self.run(name, ["export", "--parquet", pq, "--replace", src], ok=(0,) + ok2)
        # --trace reads a whole-run log's timeline: on a snapshot it may refuse (status 2, one line)
        self.run(name, ["export", "--trace", os.path.join(tmp, "t.json"), "--replace", src], ok=(0, 2))
        return row


def fmt_mib(b):
    return "-" if b is None else f"{b / MIB:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--cushim", default=os.path.join(ROOT, "target", "release", "cushim"))
    ap.add_argument("--no-fit-probe", action="store_true", help="skip the replays at fit's size")
    ap.add_argument("--only", default="", help="only files whose name contains this")
    args = ap.parse_args()
    files = sorted(
        os.path.join(args.dir, f)
        for f in os.listdir(args.dir)
        if f.endswith((".pickle", ".pkl", ".gz")) and args.only in f
    )
    sweep = Sweep(args.cushim, not args.no_fit_probe)
    print(f"{'file':60} {'peak MiB':>10} {'rsv MiB':>10} {'replay%':>8} {'fit MiB':>10} {'cats':>4} {'fit s':>6}")
    for path in files:
        with tempfile.TemporaryDirectory() as tmp:
            row = sweep.file(path, tmp)
        err = row.get("err")
        print(
            f"{row['file'][:60]:60} {fmt_mib(row.get('peak')):>10} {fmt_mib(row.get('reserved')):>10} "
            f"{'-' if err is None else f'{err:+.2f}':>8} {fmt_mib(row.get('fit')):>10} "
            f"{row.get('cats', '-'):>4} {row.get('fit_s', 0):>6.2f} {row.get('note', '')}",
            flush=True,
        )
    print(f"\n{len(sweep.violations)} violations")
    for v in sweep.violations:
        print("  " + v)
    return 1 if sweep.violations else 0


if __name__ == "__main__":
    sys.exit(main())
