//! Typed library errors. Every variant that comes from user input names the file (and, where it
//! can, the line and field) and says what to change, so the binary can print it as-is and exit 2.

mod layout;

use std::path::PathBuf;

pub use layout::LayoutError;

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be read or written (the cause is part of the message, not
    /// a separate link of the chain, so it prints once).
    #[error("{path}: {}", io_message(.error))]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// A data row is malformed; `line` is 1-based and counts the header.
    #[error("{path}:{line}: {message}")]
    BadRow {
        path: PathBuf,
        line: u64,
        message: String,
    },

    /// A structured file (YAML/JSON/CSV header) does not have the expected form.
    #[error("{path}: {message}")]
    BadFile { path: PathBuf, message: String },

    /// A model file was written by another feature-schema or file-format version.
    #[error(
        "{path}: written with {what} version {found}, this stepcast reads version {expected}; \
         retrain with `stepcast train`"
    )]
    SchemaVersion {
        path: PathBuf,
        what: &'static str,
        found: u32,
        expected: u32,
    },

    /// A dataset or selection holds no usable rows.
    #[error("{0}")]
    Empty(String),

    /// An invalid value given on the command line or in a configuration.
    #[error("{0}")]
    Invalid(String),

    /// A parallel layout that cannot run.
    #[error(transparent)]
    Layout(#[from] LayoutError),

    /// No trained model covers a query and the caller asked for strict behaviour.
    #[error("{0}")]
    MissingModel(String),

    /// A models directory's `calibration.yaml` cannot be used; the inner error names the
    /// file, field and fix (the models themselves may be fine).
    #[error(transparent)]
    Calibration(Box<Error>),
}

/// An I/O error in words, with what to check.
fn io_message(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "not found: check the path".to_string(),
        std::io::ErrorKind::PermissionDenied => {
            "permission denied: check the file's permissions".to_string()
        }
        _ => e.to_string(),
    }
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }

    pub fn bad_file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::BadFile {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The same error with what to do appended to a malformed file's message.
    pub fn hint(self, fix: &str) -> Self {
        match self {
            Error::BadFile { path, message } => Error::BadFile {
                path,
                message: format!("{message}: {fix}"),
            },
            other => other,
        }
    }

    pub fn bad_row(path: impl Into<PathBuf>, line: u64, message: impl Into<String>) -> Self {
        Error::BadRow {
            path: path.into(),
            line,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error as IoError, ErrorKind};

    /// The two I/O errors users cause themselves say what to check; the rest keep the
    /// system's words. Each names the path first.
    #[test]
    fn io_errors_name_the_path_and_what_to_check() {
        let shown =
            |kind: ErrorKind| Error::io("runs/a.csv", IoError::new(kind, "sys")).to_string();
        assert_eq!(
            shown(ErrorKind::NotFound),
            "runs/a.csv: not found: check the path"
        );
        assert_eq!(
            shown(ErrorKind::PermissionDenied),
            "runs/a.csv: permission denied: check the file's permissions"
        );
        assert_eq!(shown(ErrorKind::Other), "runs/a.csv: sys");
    }

    #[test]
    fn a_malformed_file_s_hint_is_appended_to_its_message_only() {
        let e = Error::bad_file("c.yaml", "no gpu field").hint("add gpu: h100");
        assert_eq!(e.to_string(), "c.yaml: no gpu field: add gpu: h100");
        let row = Error::bad_row("d.csv", 3, "not a number").hint("ignored");
        assert_eq!(row.to_string(), "d.csv:3: not a number");
    }
}
