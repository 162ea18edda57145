//! Which stepcast produced an output and from which inputs: every JSON output carries a
//! `provenance` object, so a number can be traced back to the code, the command line and the
//! exact files (by digest) that made it.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// stepcast's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this build comes from (12 hex digits, `-modified` when tracked files
/// differed from it, `unknown` outside a checkout); set by `build.rs`.
pub const COMMIT: &str = env!("STEPCAST_COMMIT");

/// The first 16 hex digits of the SHA-256 of `bytes`: enough to tell two files apart.
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One input of a command: what it is, where it came from and what it held.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Input {
    /// What the input is to the command: `cluster`, `models`, `dataset`, `job`, …
    pub role: &'static str,
    /// Its path, or its name when built in (`<built-in perlmutter>`, `llama2-7b`).
    pub name: String,
    /// A digest of its content (see `digest`, or a dataset's or models' own fingerprint);
    /// absent for a preset named in the binary, which the commit identifies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl Input {
    /// An input with a digest of its content.
    pub fn new(role: &'static str, name: impl Into<String>, digest: Option<String>) -> Input {
        Input {
            role,
            name: name.into(),
            digest,
        }
    }
}

/// The `provenance` object of a JSON output.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// Always `stepcast`.
    pub tool: &'static str,
    /// See `VERSION`.
    pub version: &'static str,
    /// See `COMMIT`.
    pub commit: &'static str,
    /// The command line after the program's name.
    pub arguments: Vec<String>,
    /// The files and built-in data the output was computed from.
    pub inputs: Vec<Input>,
}

impl Provenance {
    /// This process's command line, with `inputs`.
    pub fn of_this_run(inputs: Vec<Input>) -> Provenance {
        Provenance {
            tool: "stepcast",
            version: VERSION,
            commit: COMMIT,
            arguments: std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            inputs,
        }
    }

    /// `value` (a JSON object) with this provenance as its field `provenance`; any other
    /// value is wrapped as `{"provenance": …, "result": value}`.
    pub fn stamp(&self, value: serde_json::Value) -> serde_json::Value {
        let provenance = serde_json::to_value(self).expect("plain data serialises");
        match value {
            serde_json::Value::Object(mut fields) => {
                fields.insert("provenance".into(), provenance);
                serde_json::Value::Object(fields)
            }
            other => serde_json::json!({"provenance": provenance, "result": other}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_contents_apart() {
        assert_eq!(digest(b"a").len(), 16);
        assert_ne!(digest(b"a"), digest(b"b"));
        assert_eq!(digest(b"a"), digest(b"a"));
    }

    #[test]
    fn stamping_adds_provenance_and_keeps_every_field() {
        let p = Provenance::of_this_run(vec![Input::new("cluster", "x.yaml", Some(digest(b"x")))]);
        let v = p.stamp(serde_json::json!({"step_time_s": 1.5, "a": [1]}));
        assert_eq!(v.as_object().unwrap().len(), 3);
        assert_eq!(v["step_time_s"], 1.5);
        assert_eq!(v["provenance"]["inputs"][0]["role"], "cluster");
        assert_eq!(v["provenance"]["commit"], COMMIT);
        let wrapped = p.stamp(serde_json::json!([1, 2]));
        assert_eq!(wrapped["result"], serde_json::json!([1, 2]));
    }
}
