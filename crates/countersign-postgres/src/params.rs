//! How a row of `countersign_store::rows` becomes the parameters of a tokio-postgres
//! statement. The rows are shared by every backend; the order their values take in a
//! statement is this backend's, so each row's impl sits beside the SQL that relies on it.

use tokio_postgres::types::ToSql;

/// One statement parameter.
pub(crate) type Param<'a> = &'a (dyn ToSql + Sync);

/// A row's values, in the order its statements number them.
pub(crate) trait Params {
    fn params(&self) -> Vec<Param<'_>>;
}
