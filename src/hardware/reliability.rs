//! How a cluster fails, recovers and writes checkpoints: the `reliability:` and `storage:`
//! sections of a cluster file (the inputs of `fault`'s run-time model).

use serde::{Deserialize, Serialize};

/// How a cluster fails and recovers (a cluster file's `reliability:` section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reliability {
    /// Failures per node per day.
    pub failures_per_node_per_day: f64,
    /// Recovery levels: the share of failures each takes and how long it takes.
    pub recovery: Vec<RecoveryLevel>,
    /// From job submission to the first training step (start-up, loading), seconds.
    pub first_start_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryLevel {
    /// process, pod or job.
    pub level: String,
    pub share: f64,
    pub seconds: f64,
}

impl Default for Reliability {
    /// MoFa's figures from "thousands of GPU clusters": 0.5 % failures per node per day (its
    /// Table 5), recoveries at process / pod / job level in the ratio 3 : 6 : 1 taking 141, 262
    /// and 307 s (§3.4); the first start is our assumption (10 minutes).
    fn default() -> Self {
        let level = |level: &str, share, seconds| RecoveryLevel {
            level: level.into(),
            share,
            seconds,
        };
        Reliability {
            failures_per_node_per_day: 0.005,
            recovery: vec![
                level("process", 0.3, 141.0),
                level("pod", 0.6, 262.0),
                level("job", 0.1, 307.0),
            ],
            first_start_s: 600.0,
        }
    }
}

impl Reliability {
    /// Mean time to recover from one failure (eq. 41).
    pub fn mean_recovery_s(&self) -> f64 {
        let total: f64 = self.recovery.iter().map(|l| l.share).sum();
        self.recovery
            .iter()
            .map(|l| l.share * l.seconds)
            .sum::<f64>()
            / total
    }

    pub fn validate(&self, what: &str) -> std::result::Result<(), String> {
        use crate::limits::check_range;
        let r = self.failures_per_node_per_day;
        if !(r > 0.0 && r.is_finite()) {
            return Err(format!(
                "{what}: failures_per_node_per_day = {r} must be positive (a run with no \
                 failures needs no checkpoints; give a small rate such as 0.001)"
            ));
        }
        check_range(
            what,
            "failures_per_node_per_day",
            r,
            1e-7..=10.0,
            "per node per day",
        )?;
        if self.recovery.is_empty() {
            return Err(format!("{what}: recovery needs at least one level"));
        }
        for l in &self.recovery {
            check_range(
                what,
                &format!("recovery {} share", l.level),
                l.share,
                0.0..=1.0,
                "",
            )?;
            let field = format!("recovery {} seconds", l.level);
            check_range(what, &field, l.seconds, 0.0..=1e7, "s")?;
        }
        if self.recovery.iter().map(|l| l.share).sum::<f64>() <= 0.0 {
            return Err(format!("{what}: recovery shares must not all be zero"));
        }
        check_range(what, "first_start_s", self.first_start_s, 0.0..=1e7, "s")
    }
}

/// Checkpoint writes (a cluster file's `storage:` section).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    /// Write bandwidth to the checkpoint file system from one node, GB/s.
    pub checkpoint_write_gb_per_s_per_node: f64,
    /// The file system's total write bandwidth, GB/s (the cap when many nodes write).
    #[serde(default)]
    pub checkpoint_write_gb_per_s_max: Option<f64>,
}

impl Default for Storage {
    /// 2 GB/s per node, 100 GB/s in all: a modest parallel file system (our assumption).
    fn default() -> Self {
        Storage {
            checkpoint_write_gb_per_s_per_node: 2.0,
            checkpoint_write_gb_per_s_max: Some(100.0),
        }
    }
}

impl Storage {
    pub fn validate(&self, what: &str) -> std::result::Result<(), String> {
        use crate::limits::check_range;
        let field = "checkpoint_write_gb_per_s_per_node";
        check_range(
            what,
            field,
            self.checkpoint_write_gb_per_s_per_node,
            1e-3..=1e5,
            "GB/s",
        )?;
        if let Some(m) = self.checkpoint_write_gb_per_s_max {
            check_range(what, "checkpoint_write_gb_per_s_max", m, 1e-3..=1e7, "GB/s")?;
        }
        Ok(())
    }

    /// Seconds to write `bytes` from `nodes` nodes.
    pub fn write_s(&self, bytes: f64, nodes: f64) -> f64 {
        let mut bw = self.checkpoint_write_gb_per_s_per_node * nodes.max(1.0);
        if let Some(max) = self.checkpoint_write_gb_per_s_max {
            bw = bw.min(max);
        }
        bytes / (bw * 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eq. 41 weighs each level by its share of the shares given, so 6 : 12 : 2 is 3 : 6 : 1.
    #[test]
    fn mean_recovery_normalises_the_shares() {
        let mut r = Reliability::default();
        for l in &mut r.recovery {
            l.share *= 20.0;
        }
        assert!((r.mean_recovery_s() - 230.2).abs() < 1e-9);
    }

    /// Nodes write side by side until the file system's total caps them.
    #[test]
    fn a_checkpoint_writes_at_the_nodes_bandwidth_up_to_the_file_systems() {
        let s = Storage::default();
        // 4 nodes at 2 GB/s: 8 GB/s; 100 nodes would be 200, capped at 100
        assert_eq!(s.write_s(16e9, 4.0), 2.0);
        assert_eq!(s.write_s(100e9, 100.0), 1.0);
        // a fraction of a node writes as one
        assert_eq!(s.write_s(2e9, 0.5), 1.0);
        let uncapped = Storage {
            checkpoint_write_gb_per_s_max: None,
            ..s
        };
        assert_eq!(uncapped.write_s(200e9, 100.0), 1.0);
    }

    #[test]
    fn each_refusal_names_its_field() {
        let spoilt = |f: fn(&mut Reliability)| {
            let mut r = Reliability::default();
            f(&mut r);
            r.validate("c.yaml").unwrap_err()
        };
        assert!(spoilt(|r| r.failures_per_node_per_day = f64::INFINITY).contains("positive"));
        assert!(spoilt(|r| r.failures_per_node_per_day = 11.0).contains("failures_per_node"));
        assert!(spoilt(|r| r.recovery.clear()).contains("at least one level"));
        assert!(spoilt(|r| r.recovery[1].share = 1.5).contains("recovery pod share"));
        assert!(spoilt(|r| r.recovery[2].seconds = -1.0).contains("recovery job seconds"));
        assert!(
            spoilt(|r| r.recovery.iter_mut().for_each(|l| l.share = 0.0))
                .contains("must not all be zero")
        );
        assert!(spoilt(|r| r.first_start_s = 2e7).contains("first_start_s"));
        Reliability::default().validate("c.yaml").unwrap();
        let e = Storage {
            checkpoint_write_gb_per_s_max: Some(0.0),
            ..Storage::default()
        }
        .validate("c.yaml")
        .unwrap_err();
        assert!(e.contains("checkpoint_write_gb_per_s_max"), "{e}");
        Storage::default().validate("c.yaml").unwrap();
    }
}
