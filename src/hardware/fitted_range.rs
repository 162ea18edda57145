//! The range of the runs a calibration was fitted on. A runtime fitted on single-node steps of
//! sub-billion-parameter models has measured nothing about 1,024 GPUs or 70 B parameters, and
//! its cross-validated error says nothing about them either; a prediction outside the range
//! says so instead of passing the fit's error off as its own.

use serde::{Deserialize, Serialize};

/// Where one run, or one prediction, lies in the dimensions a runtime's fit depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPoint {
    pub gpus: u64,
    /// Nodes the GPUs span (collectives across them cross the network).
    pub nodes: u64,
    /// Model parameters (all of them, tp = 1).
    pub params: u64,
    pub seq_len: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// The training type's name (fp16, bf16, fp8, …).
    pub dtype: String,
    /// Parts of each layer ran captured in CUDA graphs (the host's issue cost differs).
    pub cuda_graphs: bool,
    /// The attention ran as FlashAttention-2 calls (`--attention-kernel flash-attention-2`),
    /// whose own efficiency a runtime fits only from runs that made them.
    pub flash_attention_2: bool,
}

/// The smallest box holding every run of a fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedRange {
    /// Fewest and most GPUs of a run.
    pub gpus: [u64; 2],
    /// Fewest and most nodes of a run.
    pub nodes: [u64; 2],
    /// Smallest and largest model, billions of parameters.
    pub params_billions: [f64; 2],
    /// Shortest and longest sequence, tokens.
    pub seq_len: [u64; 2],
    /// Largest degree of each parallelism any run used.
    pub max_tp: u64,
    pub max_pp: u64,
    pub max_cp: u64,
    pub max_ep: u64,
    /// The training types of the runs.
    pub dtypes: Vec<String>,
    /// Whether any run captured parts of its layers in CUDA graphs (left out when none did,
    /// as in every file written before the field existed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cuda_graphs: bool,
    /// Whether any run's attention ran as FlashAttention-2 calls (left out when none did, as in
    /// every file written before the field existed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flash_attention_2: bool,
}

/// How far beyond the runs' smallest and largest a model or a sequence may lie and still count
/// as inside: a factor, not a tolerance for noise (a 7 B model beside runs of 8–70 B is the
/// same regime; half the shortest sequence is not).
const SIZE_MARGIN: f64 = 1.25;

fn billions(params: u64) -> f64 {
    params as f64 / 1e9
}

/// A count with thousands separated, as the reports print them.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn span(lo: u64, hi: u64) -> String {
    if lo == hi {
        count(lo)
    } else {
        format!("{}–{}", count(lo), count(hi))
    }
}

fn params_span(lo: f64, hi: f64) -> String {
    let b = |v: f64| {
        if v < 10.0 {
            format!("{v:.2}")
        } else {
            format!("{v:.0}")
        }
    };
    if b(lo) == b(hi) {
        format!("{} B", b(lo))
    } else {
        format!("{}–{} B", b(lo), b(hi))
    }
}

impl FittedRange {
    /// The range of `points`; none without any.
    pub fn of(points: &[RunPoint]) -> Option<FittedRange> {
        let first = points.first()?;
        let mut r = FittedRange {
            gpus: [first.gpus; 2],
            nodes: [first.nodes; 2],
            params_billions: [billions(first.params); 2],
            seq_len: [first.seq_len; 2],
            max_tp: 0,
            max_pp: 0,
            max_cp: 0,
            max_ep: 0,
            dtypes: Vec::new(),
            cuda_graphs: false,
            flash_attention_2: false,
        };
        let widen_u = |range: &mut [u64; 2], v: u64| *range = [range[0].min(v), range[1].max(v)];
        for p in points {
            widen_u(&mut r.gpus, p.gpus);
            widen_u(&mut r.nodes, p.nodes);
            widen_u(&mut r.seq_len, p.seq_len);
            let b = billions(p.params);
            r.params_billions = [r.params_billions[0].min(b), r.params_billions[1].max(b)];
            r.max_tp = r.max_tp.max(p.tp);
            r.max_pp = r.max_pp.max(p.pp);
            r.max_cp = r.max_cp.max(p.cp);
            r.max_ep = r.max_ep.max(p.ep);
            if !r.dtypes.contains(&p.dtype) {
                r.dtypes.push(p.dtype.clone());
            }
            r.cuda_graphs |= p.cuda_graphs;
            r.flash_attention_2 |= p.flash_attention_2;
        }
        r.dtypes.sort();
        Some(r)
    }

    /// What of `p` lies outside the range, each as "what it is (the runs': their range)";
    /// empty inside it.
    pub fn outside(&self, p: &RunPoint) -> Vec<String> {
        let mut out = Vec::new();
        let beyond = |v: u64, [lo, hi]: [u64; 2]| v < lo || v > hi;
        if beyond(p.gpus, self.gpus) || beyond(p.nodes, self.nodes) {
            out.push(format!(
                "{} GPU{} on {} node{} (runs: {} GPUs on {} node{})",
                count(p.gpus),
                if p.gpus == 1 { "" } else { "s" },
                count(p.nodes),
                if p.nodes == 1 { "" } else { "s" },
                span(self.gpus[0], self.gpus[1]),
                span(self.nodes[0], self.nodes[1]),
                if self.nodes[1] == 1 { "" } else { "s" },
            ));
        }
        let b = billions(p.params);
        let [lo, hi] = self.params_billions;
        if b < lo / SIZE_MARGIN || b > hi * SIZE_MARGIN {
            out.push(format!(
                "{} parameters (runs: {})",
                params_span(b, b),
                params_span(lo, hi)
            ));
        }
        let (s, [lo, hi]) = (p.seq_len as f64, self.seq_len.map(|v| v as f64));
        if s < lo / SIZE_MARGIN || s > hi * SIZE_MARGIN {
            out.push(format!(
                "sequences of {} token{} (runs: {})",
                count(p.seq_len),
                if p.seq_len == 1 { "" } else { "s" },
                span(self.seq_len[0], self.seq_len[1])
            ));
        }
        for (name, v, max) in [
            ("tp", p.tp, self.max_tp),
            ("pp", p.pp, self.max_pp),
            ("cp", p.cp, self.max_cp),
            ("ep", p.ep, self.max_ep),
        ] {
            if v > max {
                out.push(format!("{name} {v} (runs: at most {max})"));
            }
        }
        if !self.dtypes.contains(&p.dtype) {
            out.push(format!("{} (runs: {})", p.dtype, self.dtypes.join(", ")));
        }
        if p.cuda_graphs && !self.cuda_graphs {
            out.push("CUDA graphs (runs: every kernel issued eagerly)".into());
        }
        if p.flash_attention_2 && !self.flash_attention_2 {
            out.push(
                "FlashAttention-2 (runs: none, so the runtime takes its calls at their costed \
                 speed)"
                    .into(),
            );
        }
        out
    }

    /// Every span lowest first and the model sizes finite and positive; `what` names the
    /// file and entry.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        let spans = [
            ("gpus", self.gpus.map(|v| v as f64)),
            ("nodes", self.nodes.map(|v| v as f64)),
            ("params_billions", self.params_billions),
            ("seq_len", self.seq_len.map(|v| v as f64)),
        ];
        for (field, [lo, hi]) in spans {
            if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi) {
                return Err(format!(
                    "{what}: fitted_on.range.{field} = [{lo}, {hi}] is not a range of runs (lowest \
                     above 0 and not above highest)"
                ));
            }
        }
        for (field, max) in [
            ("max_tp", self.max_tp),
            ("max_pp", self.max_pp),
            ("max_cp", self.max_cp),
            ("max_ep", self.max_ep),
        ] {
            if max == 0 {
                return Err(format!(
                    "{what}: fitted_on.range.{field} = 0: a run's parallel degree is at least 1"
                ));
            }
        }
        if self.dtypes.is_empty() {
            return Err(format!(
                "{what}: fitted_on.range.dtypes is empty: the runs had a training type"
            ));
        }
        Ok(())
    }

    /// The range in one line, for `models show`.
    pub fn summary(&self) -> String {
        let mut parts = vec![
            format!(
                "{} GPUs on {} node{}",
                span(self.gpus[0], self.gpus[1]),
                span(self.nodes[0], self.nodes[1]),
                if self.nodes[1] == 1 { "" } else { "s" }
            ),
            format!(
                "{} parameters",
                params_span(self.params_billions[0], self.params_billions[1])
            ),
            format!(
                "sequences of {} tokens",
                span(self.seq_len[0], self.seq_len[1])
            ),
        ];
        for (name, max) in [
            ("tp", self.max_tp),
            ("pp", self.max_pp),
            ("cp", self.max_cp),
            ("ep", self.max_ep),
        ] {
            if max > 1 {
                parts.push(format!("{name} ≤ {max}"));
            }
        }
        parts.push(self.dtypes.join(", "));
        if self.cuda_graphs {
            parts.push("CUDA graphs".into());
        }
        if self.flash_attention_2 {
            parts.push("FlashAttention-2".into());
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(gpus: u64, params: u64, seq_len: u64, tp: u64, dtype: &str) -> RunPoint {
        RunPoint {
            gpus,
            nodes: gpus.div_ceil(8),
            params,
            seq_len,
            tp,
            pp: 1,
            cp: 1,
            ep: 1,
            dtype: dtype.into(),
            cuda_graphs: false,
            flash_attention_2: false,
        }
    }

    #[test]
    fn a_point_inside_the_runs_is_inside_and_each_way_out_is_named() {
        let runs = [
            point(2, 350_000_000, 1024, 1, "fp16"),
            point(8, 8_000_000_000, 8192, 8, "bf16"),
            point(4, 1_300_000_000, 2048, 2, "fp16"),
        ];
        let r = FittedRange::of(&runs).unwrap();
        assert_eq!(r.gpus, [2, 8]);
        assert_eq!(r.nodes, [1, 1]);
        assert_eq!(r.seq_len, [1024, 8192]);
        assert_eq!(r.max_tp, 8);
        assert_eq!(r.dtypes, ["bf16", "fp16"]);
        for p in &runs {
            assert!(r.outside(p).is_empty(), "{:?}", r.outside(p));
        }
        let far = RunPoint {
            pp: 8,
            cp: 2,
            ..point(1024, 70_000_000_000, 32768, 8, "fp8")
        };
        let why = r.outside(&far).join("; ");
        for expected in [
            "1,024 GPUs on 128 nodes (runs: 2–8 GPUs on 1 node)",
            "70 B parameters (runs: 0.35–8.00 B)",
            "sequences of 32,768 tokens (runs: 1,024–8,192)",
            "pp 8 (runs: at most 1)",
            "cp 2 (runs: at most 1)",
            "fp8 (runs: bf16, fp16)",
        ] {
            assert!(why.contains(expected), "{why}");
        }
        assert!(!why.contains("tp 8"), "{why}");
        // fewer GPUs than any run is outside too: the fit's host and overlap were not seen there
        assert_eq!(
            r.outside(&point(1, 1_000_000_000, 2048, 1, "fp16")).len(),
            1
        );
        // sizes within a factor 1.25 of the runs' count as inside, beyond it not
        assert!(r
            .outside(&point(8, 9_900_000_000, 820, 1, "bf16"))
            .is_empty());
        assert_eq!(
            r.outside(&point(8, 10_100_000_000, 810, 1, "bf16")).len(),
            2
        );
        // one token is a token, not "1 tokens"
        assert_eq!(
            r.outside(&point(8, 1_000_000_000, 1, 1, "bf16")),
            ["sequences of 1 token (runs: 1,024–8,192)"]
        );
        assert!(FittedRange::of(&[]).is_none());
        // a step whose layers replay CUDA graphs, beside runs that issued every kernel
        let graphed = RunPoint {
            cuda_graphs: true,
            ..runs[0].clone()
        };
        assert_eq!(
            r.outside(&graphed),
            ["CUDA graphs (runs: every kernel issued eagerly)"]
        );
        let with = FittedRange::of(&[graphed.clone(), runs[1].clone()]).unwrap();
        assert!(with.cuda_graphs && with.outside(&graphed).is_empty());
        assert!(
            with.summary().ends_with("CUDA graphs"),
            "{}",
            with.summary()
        );
        // a FlashAttention-2 step beside runs whose attention ran another kernel: their fit
        // says nothing of FA2's own efficiency
        let fa2 = RunPoint {
            flash_attention_2: true,
            ..runs[0].clone()
        };
        let why = r.outside(&fa2);
        assert!(
            why.len() == 1 && why[0].starts_with("FlashAttention-2 (runs: none"),
            "{why:?}"
        );
        let with = FittedRange::of(&[fa2.clone(), runs[1].clone()]).unwrap();
        assert!(with.flash_attention_2 && with.outside(&fa2).is_empty());
        assert!(with.summary().ends_with("FlashAttention-2"));
        assert!(r.outside(&runs[1]).is_empty() && !r.flash_attention_2);
    }

    #[test]
    fn the_range_reads_in_one_line_and_survives_its_file() {
        let r = FittedRange::of(&[
            point(8, 7_000_000_000, 4096, 2, "bf16"),
            point(64, 70_000_000_000, 4096, 8, "bf16"),
        ])
        .unwrap();
        assert_eq!(
            r.summary(),
            "8–64 GPUs on 1–8 nodes, 7.00–70 B parameters, sequences of 4,096 tokens, tp ≤ 8, bf16"
        );
        let text = serde_norway::to_string(&r).unwrap();
        let back: FittedRange = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert!(r.validate("f").is_ok());
        let upside_down = FittedRange {
            gpus: [64, 8],
            ..r.clone()
        };
        assert!(upside_down
            .validate("m/calibration.yaml (c)")
            .unwrap_err()
            .contains("m/calibration.yaml (c): fitted_on.range.gpus = [64, 8]"));
        let nan = FittedRange {
            params_billions: [f64::NAN, 1.0],
            ..r.clone()
        };
        assert!(nan.validate("f").is_err());
        let no_tp = FittedRange {
            max_tp: 0,
            ..r.clone()
        };
        assert!(no_tp.validate("f").unwrap_err().contains("max_tp = 0"));
        let untyped = FittedRange {
            dtypes: vec![],
            ..r
        };
        assert!(untyped
            .validate("f")
            .unwrap_err()
            .contains("dtypes is empty"));
    }

    /// A range's file is refused where a bound is not a count of runs: zero, infinite, or
    /// above the other; one GPU reads "1 GPU on 1 node".
    #[test]
    fn a_range_is_refused_at_each_impossible_bound() {
        let r = FittedRange::of(&[point(8, 7_000_000_000, 4096, 1, "bf16")]).unwrap();
        assert!(r.validate("f").is_ok());
        type Spoil = fn(&mut FittedRange);
        let bad: [(&str, Spoil); 9] = [
            ("gpus", |b| b.gpus = [0, 8]),
            ("nodes", |b| b.nodes = [1, 0]),
            ("seq_len", |b| b.seq_len = [0, 4096]),
            ("params_billions", |b| b.params_billions = [0.0, 7.0]),
            ("params_billions", |b| {
                b.params_billions = [7.0, f64::INFINITY]
            }),
            ("params_billions", |b| {
                b.params_billions = [f64::INFINITY; 2]
            }),
            ("max_pp", |b| b.max_pp = 0),
            ("max_cp", |b| b.max_cp = 0),
            ("max_ep", |b| b.max_ep = 0),
        ];
        for (field, spoil) in bad {
            let mut range = r.clone();
            spoil(&mut range);
            let e = range.validate("f").unwrap_err();
            assert!(
                e.starts_with(&format!("f: fitted_on.range.{field} = ")),
                "{e}"
            );
        }
        // a run of fewer GPUs after the first widens the range down
        let one = point(1, 7_000_000_000, 4096, 1, "bf16");
        let runs =
            FittedRange::of(&[point(8, 7_000_000_000, 4096, 1, "bf16"), one.clone()]).unwrap();
        assert_eq!(runs.gpus, [1, 8]);
        let two = FittedRange::of(&[point(2, 7_000_000_000, 4096, 1, "bf16")]).unwrap();
        assert_eq!(
            two.outside(&one),
            ["1 GPU on 1 node (runs: 2 GPUs on 1 node)"]
        );
        assert_eq!(
            two.summary(),
            "2 GPUs on 1 node, 7.00 B parameters, sequences of 4,096 tokens, bf16"
        );
        // sizes under 10 B keep two decimals, from 10 B whole billions
        assert_eq!(params_span(9.5, 10.0), "9.50–10 B");
        assert_eq!(params_span(10.0, 10.4), "10 B");
    }
}
