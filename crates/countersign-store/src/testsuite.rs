//! The test suite every backend must pass. Placeholder: filled in with the SQLite backend.
