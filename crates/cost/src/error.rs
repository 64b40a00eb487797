//! Errors of loading device profiles and latency tables.

/// An error while finding, reading, validating or writing a device profile or a
/// measured latency table.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct CostError {
    pub kind: CostErrorKind,
}

/// What went wrong; messages are lower-case and name the fix where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CostErrorKind {
    /// A name that is neither a built-in profile nor an existing file.
    #[error(
        "unknown device `{name}`; use one of the built-in profiles ({known}) or a path to a device profile JSON file"
    )]
    UnknownDevice { name: String, known: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not JSON of the expected shape (serde's detail names the field).
    #[error("{origin} is not a valid {what}: {detail}")]
    Parse {
        origin: String,
        what: &'static str,
        detail: String,
    },
    /// A profile field outside its allowed range.
    #[error("device profile `{profile}` ({origin}): `{field}` {requirement}, got {value}")]
    InvalidProfile {
        profile: String,
        origin: String,
        field: &'static str,
        requirement: &'static str,
        value: String,
    },
    #[error(
        "{origin}: unsupported format `{found}` (expected `{expected}`); re-record the table with this version of outcore"
    )]
    UnsupportedFormat {
        origin: String,
        found: String,
        expected: &'static str,
    },
    /// A roofline efficiency outside `(0, 1]`.
    #[error("efficiency `{class}.{which}` must lie in (0, 1], got {value}")]
    InvalidEfficiency {
        class: &'static str,
        which: &'static str,
        value: f64,
    },
    /// A latency table whose content breaks a rule (negative time, duplicate op).
    #[error("{origin}: {detail}")]
    InvalidTable { origin: String, detail: String },
}

impl CostError {
    pub fn new(kind: CostErrorKind) -> Self {
        CostError { kind }
    }
}

impl From<CostErrorKind> for CostError {
    fn from(kind: CostErrorKind) -> Self {
        CostError { kind }
    }
}
