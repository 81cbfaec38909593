//! Configuration from environment variables: `CUSHIM_ALLOC_CONF` (`alloc`) and
//! `CUSHIM_HISTORY` (`history`). A bad key or value prints one line on stderr naming it and
//! the accepted values, then falls back to defaults; it never aborts the host.

pub mod alloc;
pub mod history;
pub mod signal;
