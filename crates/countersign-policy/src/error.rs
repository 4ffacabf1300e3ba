//! Why a policy set was refused. Each message names the file and the policy, so that the
//! operator can fix it from `doctor`'s or the log's line alone.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A file is not valid Cedar.
    #[error("{file}: not valid Cedar: {message}")]
    Parse { file: String, message: String },
    /// Two policies have the same id.
    #[error(
        "{file}: policy id {id:?} is used twice (ids come from @id(\"...\") or the file and position)"
    )]
    DuplicateId { file: String, id: String },
    /// An annotation countersign does not know, or a value it cannot use.
    #[error("{file}: policy {id:?}: {message}")]
    Annotation {
        file: String,
        id: String,
        message: String,
    },
    /// The policies do not type-check against the schema.
    #[error("the policies do not match countersign's schema: {0}")]
    Validation(String),
    /// Templates, or something else this version does not use.
    #[error("{file}: {message}")]
    Unsupported { file: String, message: String },
    /// The schema itself could not be built (a detail key Cedar cannot name, say).
    #[error("could not build the schema: {0}")]
    Schema(String),
}
