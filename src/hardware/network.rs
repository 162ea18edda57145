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
    /// Inter-node bandwidth one GPU gets when `gpus_per_node` GPUs of a node share its NICs,
    /// in bytes/s.
    pub fn inter_node_bytes_per_s_per_gpu(&self, gpus_per_node: u32) -> f64 {
        let node = self.inter_node.nics_per_node as f64
            * self.inter_node.bandwidth_gbit_per_s_per_nic
            * 1e9
            / 8.0;
        node / gpus_per_node.max(1) as f64
    }

    pub fn intra_node_bytes_per_s(&self) -> f64 {
        self.intra_node.bandwidth_gb_per_s * 1e9
    }

    pub fn validate(&self, what: &str) -> Result<(), String> {
        let fields = [
            (
                "network.intra_node.bandwidth_gb_per_s",
                self.intra_node.bandwidth_gb_per_s,
            ),
            (
                "network.inter_node.bandwidth_gbit_per_s_per_nic",
                self.inter_node.bandwidth_gbit_per_s_per_nic,
            ),
        ];
        for (field, value) in fields {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!(
                    "{what}: {field} = {value} must be a positive number"
                ));
            }
        }
        for (field, value) in [
            ("network.intra_node.latency_us", self.intra_node.latency_us),
            ("network.inter_node.latency_us", self.inter_node.latency_us),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!(
                    "{what}: {field} = {value} must be zero or positive"
                ));
            }
        }
        if self.inter_node.nics_per_node == 0 {
            return Err(format!(
                "{what}: network.inter_node.nics_per_node must be at least 1"
            ));
        }
        Ok(())
    }
}
