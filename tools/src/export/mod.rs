//! `cushim export`: recorded memory where people already analyse it: Parquet tables for
//! SQL engines (`parquet_dir`), a Chrome trace for Perfetto (`trace`), both fed by one walk of
//! each input (`source`). What the user does and the schemas are in `docs/EXPORT.md`.

pub mod categories;
pub mod parquet_dir;
pub mod source;
pub mod table;
pub mod trace;
