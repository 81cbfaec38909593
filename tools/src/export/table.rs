//! One Parquet file of one table, written a row group at a time.
//!
//! Policy: rows are buffered column by column and written as a row group every
//! [`GROUP_ROWS`] rows, so a table of any length is written in memory bounded by one row
//! group (about 60 MB for the events table), whatever the input's length. Strings are
//! dictionary encoded (the default), so a column that repeats a few values (action, site,
//! range path) costs little on disk; pages are Snappy compressed. The file is written to a
//! temporary name beside it (`cushim::files::temp_file`: random, exclusive) and renamed
//! into place only when whole, so a reader never sees a half-written table.
//!
//! It uses the `parquet` crate's low-level column writers (no Arrow): the tables are flat,
//! their columns are known, and the Arrow layer would add most of the crate's compile cost.

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per row group.
pub const GROUP_ROWS: usize = 1 << 18;

/// A column's physical type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    I32,
    I64,
    Str,
}

/// One column's buffered values of the current row group.
struct Column {
    kind: Kind,
    optional: bool,
    i32s: Vec<i32>,
    i64s: Vec<i64>,
    strs: Vec<ByteArray>,
    /// Definition levels (1 present, 0 null), for an optional column.
    defs: Vec<i16>,
}

/// A table being written.
pub struct Table {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<SerializedFileWriter<BufWriter<std::fs::File>>>,
    cols: Vec<Column>,
    rows: usize,
    /// Rows written in all.
    pub total: u64,
}

/// A column of a table's schema: name, type, whether it may be null.
pub type Spec = (&'static str, Kind, bool);

fn schema_text(name: &str, cols: &[Spec]) -> String {
    let mut s = format!("message {name} {{\n");
    for (n, k, opt) in cols {
        let rep = if *opt { "optional" } else { "required" };
        let ty = match k {
            Kind::I32 => "int32",
            Kind::I64 => "int64",
            Kind::Str => "binary",
        };
        let ann = if *k == Kind::Str { " (STRING)" } else { "" };
        s.push_str(&format!("  {rep} {ty} {n}{ann};\n"));
    }
    s.push('}');
    s
}

impl Table {
    /// Start the table `name` with columns `cols` at `path` (a temporary name until
    /// [`Table::finish`]).
    pub fn create(path: &Path, name: &str, cols: &[Spec]) -> Result<Table, String> {
        let at = |e: String| format!("writing {}: {e}", path.display());
        let schema = parse_message_type(&schema_text(name, cols))
            .map_err(|e| at(format!("the schema: {e}")))?;
        let (file, tmp) = cushim::files::temp_file::create_beside(path).map_err(at)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_size(GROUP_ROWS)
            .set_created_by(format!("cushim {}", cushim::version::LONG))
            .build();
        let writer = SerializedFileWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            Arc::new(schema),
            Arc::new(props),
        );
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(at(e.to_string()));
            }
        };
        Ok(Table {
            path: path.to_path_buf(),
            tmp,
            writer: Some(writer),
            cols: cols
                .iter()
                .map(|&(_, kind, optional)| Column {
                    kind,
                    optional,
                    i32s: Vec::new(),
                    i64s: Vec::new(),
                    strs: Vec::new(),
                    defs: Vec::new(),
                })
                .collect(),
            rows: 0,
            total: 0,
        })
    }

    pub fn i32(&mut self, c: usize, v: i32) {
        self.cols[c].i32s.push(v);
    }

    pub fn i64(&mut self, c: usize, v: i64) {
        self.cols[c].i64s.push(v);
    }

    pub fn opt_i64(&mut self, c: usize, v: Option<i64>) {
        let col = &mut self.cols[c];
        col.defs.push(i16::from(v.is_some()));
        if let Some(v) = v {
            col.i64s.push(v);
        }
    }

    pub fn str(&mut self, c: usize, v: ByteArray) {
        self.cols[c].strs.push(v);
    }

    pub fn opt_str(&mut self, c: usize, v: Option<ByteArray>) {
        let col = &mut self.cols[c];
        col.defs.push(i16::from(v.is_some()));
        if let Some(v) = v {
            col.strs.push(v);
        }
    }

    /// The current row is complete (every column was given a value): a row group is
    /// written when full.
    pub fn end_row(&mut self) -> Result<(), String> {
        self.rows += 1;
        if self.rows >= GROUP_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        if self.rows == 0 {
            return Ok(());
        }
        let at = |e: parquet::errors::ParquetError| format!("writing {}: {e}", self.tmp.display());
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| format!("writing {}: already finished", self.tmp.display()))?;
        let mut rg = w.next_row_group().map_err(at)?;
        let mut i = 0;
        while let Some(mut cw) = rg.next_column().map_err(at)? {
            let col = &mut self.cols[i];
            let defs = col.optional.then_some(&col.defs[..]);
            match col.kind {
                Kind::I32 => cw.typed::<Int32Type>().write_batch(&col.i32s, defs, None),
                Kind::I64 => cw.typed::<Int64Type>().write_batch(&col.i64s, defs, None),
                Kind::Str => cw
                    .typed::<ByteArrayType>()
                    .write_batch(&col.strs, defs, None),
            }
            .map_err(at)?;
            cw.close().map_err(at)?;
            col.i32s.clear();
            col.i64s.clear();
            col.strs.clear();
            col.defs.clear();
            i += 1;
        }
        rg.close().map_err(at)?;
        self.total += self.rows as u64;
        self.rows = 0;
        Ok(())
    }

    /// Write the last row group and the footer, and rename the file into place.
    pub fn finish(mut self) -> Result<PathBuf, String> {
        let r = self.finish_inner();
        if r.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        r.map(|()| self.path.clone())
    }

    fn finish_inner(&mut self) -> Result<(), String> {
        self.flush()?;
        let at = |e: String| format!("writing {}: {e}", self.tmp.display());
        let w = self
            .writer
            .take()
            .ok_or_else(|| at("already finished".into()))?;
        let mut buf = w.into_inner().map_err(|e| at(e.to_string()))?;
        buf.flush().map_err(|e| at(e.to_string()))?;
        let file = buf.into_inner().map_err(|e| at(e.error().to_string()))?;
        file.sync_all().map_err(|e| at(format!("fsync: {e}")))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(|e| {
            format!(
                "renaming {} to {}: {e}",
                self.tmp.display(),
                self.path.display()
            )
        })
    }
}

impl Drop for Table {
    /// A table dropped unfinished (an error on the way) leaves no temporary behind.
    fn drop(&mut self) {
        if self.writer.is_some() {
            self.writer = None;
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;

    #[test]
    fn a_long_table_is_written_in_row_groups_and_reads_back_with_its_nulls() {
        let dir = std::env::temp_dir().join(format!("cushim-table-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        let path = dir.join("t.parquet");
        let cols: [Spec; 3] = [
            ("n", Kind::I64, false),
            ("half", Kind::I64, true),
            ("name", Kind::Str, true),
        ];
        let mut t = Table::create(&path, "t", &cols).expect("create");
        let rows = GROUP_ROWS * 2 + 7;
        let word = ByteArray::from("w".as_bytes().to_vec());
        for i in 0..rows {
            t.i64(0, i as i64);
            t.opt_i64(1, (i % 2 == 0).then_some(i as i64 / 2));
            t.opt_str(2, (i % 3 == 0).then(|| word.clone()));
            t.end_row().expect("row");
        }
        // Nothing is at the final name until the table is whole.
        assert!(!path.exists());
        t.finish().expect("finish");
        let r = SerializedFileReader::new(std::fs::File::open(&path).expect("open"))
            .expect("a Parquet file");
        let meta = r.metadata();
        assert_eq!(meta.num_row_groups(), 3);
        assert_eq!(meta.file_metadata().num_rows(), rows as i64);
        let mut seen = 0usize;
        for (i, row) in r.get_row_iter(None).expect("rows").enumerate() {
            let row = row.expect("row");
            assert_eq!(row.get_long(0).expect("n"), i as i64);
            assert_eq!(row.get_long(1).ok(), (i % 2 == 0).then_some(i as i64 / 2));
            assert_eq!(
                row.get_string(2).ok().map(String::as_str),
                (i % 3 == 0).then_some("w")
            );
            seen += 1;
        }
        assert_eq!(seen, rows);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("read_dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
