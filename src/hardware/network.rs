//! Interconnect tiers of a cluster: the intra-node fabric (NVLink / xGMI) and the inter-node
//! network (InfiniBand / Slingshot / RoCE). Bandwidths are per direction.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntraNodeTier {
    /// e.g. "NVLink 4 + NVSwitch".
    pub technology: String,
    /// What one GPU can send to its peers, in GB/s (gigabytes), one direction.
    pub bandwidth_gb_per_s: f64,
    /// Small-message latency of one hop, in microseconds.
    pub latency_us: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterNodeTier {
    /// e.g. "InfiniBand NDR".
    pub technology: String,
    pub nics_per_node: u32,
    /// Line rate of one NIC, in Gb/s (gigabits), one direction.
    pub bandwidth_gbit_per_s_per_nic: f64,
    /// Small-message latency between nodes, in microseconds.
    pub latency_us: f64,
    /// e.g. "fat-tree", "dragonfly", "rail-optimized fat-tree".
    pub topology: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub intra_node: IntraNodeTier,
    pub inter_node: InterNodeTier,
}

impl NetworkSpec {
    pub fn intra_node_bytes_per_s(&self) -> f64 {
        self.intra_node.bandwidth_gb_per_s * 1e9
    }

    /// Checks every number against its physical range; `what` names the file.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        use crate::limits::check_range;
        let (intra, inter) = (&self.intra_node, &self.inter_node);
        check_range(
            what,
            "network.intra_node.bandwidth_gb_per_s",
            intra.bandwidth_gb_per_s,
            0.1..=100_000.0,
            "GB/s",
        )?;
        check_range(
            what,
            "network.inter_node.bandwidth_gbit_per_s_per_nic",
            inter.bandwidth_gbit_per_s_per_nic,
            0.1..=100_000.0,
            "Gb/s",
        )?;
        for (field, v) in [
            ("network.intra_node.latency_us", intra.latency_us),
            ("network.inter_node.latency_us", inter.latency_us),
        ] {
            check_range(what, field, v, 0.0..=100_000.0, "µs")?;
        }
        check_range(
            what,
            "network.inter_node.nics_per_node",
            inter.nics_per_node as f64,
            1.0..=256.0,
            "NICs",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DGX H100's network (NVLink 4, eight 400 Gb/s NICs).
    fn dgx_h100() -> NetworkSpec {
        NetworkSpec {
            intra_node: IntraNodeTier {
                technology: "NVLink 4 + NVSwitch".into(),
                bandwidth_gb_per_s: 450.0,
                latency_us: 2.0,
            },
            inter_node: InterNodeTier {
                technology: "InfiniBand NDR".into(),
                nics_per_node: 8,
                bandwidth_gbit_per_s_per_nic: 400.0,
                latency_us: 3.0,
                topology: "rail-optimized fat-tree".into(),
            },
        }
    }

    #[test]
    fn the_fabric_speaks_bytes_per_second() {
        assert_eq!(dgx_h100().intra_node_bytes_per_s(), 450e9);
    }

    /// Every number is checked against its range, and a refusal names the file and field.
    #[test]
    fn each_number_out_of_its_range_is_refused_by_name() {
        assert_eq!(dgx_h100().validate("c.yaml"), Ok(()));
        type Edit = fn(&mut NetworkSpec);
        let cases: [(Edit, &str); 7] = [
            (
                |n| n.intra_node.bandwidth_gb_per_s = 0.0,
                "intra_node.bandwidth_gb_per_s = 0",
            ),
            (
                |n| n.intra_node.bandwidth_gb_per_s = f64::NAN,
                "intra_node.bandwidth_gb_per_s",
            ),
            (
                |n| n.inter_node.bandwidth_gbit_per_s_per_nic = 1e6,
                "bandwidth_gbit_per_s_per_nic",
            ),
            (
                |n| n.intra_node.latency_us = -1.0,
                "intra_node.latency_us = -1",
            ),
            (|n| n.inter_node.latency_us = 1e6, "inter_node.latency_us"),
            (|n| n.inter_node.nics_per_node = 0, "nics_per_node = 0"),
            (|n| n.inter_node.nics_per_node = 257, "nics_per_node = 257"),
        ];
        for (edit, says) in cases {
            let mut n = dgx_h100();
            edit(&mut n);
            let message = n.validate("c.yaml").unwrap_err();
            assert!(message.starts_with("c.yaml: network."), "{message}");
            assert!(message.contains(says), "{message}");
        }
        // the bounds themselves are physical
        let mut n = dgx_h100();
        n.inter_node.nics_per_node = 256;
        n.intra_node.latency_us = 0.0;
        assert_eq!(n.validate("c.yaml"), Ok(()));
    }
}
