//! Expert routing measured in a run, per layer: how many tokens the router sent to each
//! expert (or only the busiest expert's tokens over the mean). From the token counts the load
//! of the busiest expert-parallel rank follows for any ep — Megatron-Core places experts
//! `r·E/ep … (r+1)·E/ep − 1` on rank r — so one file answers "what does this routing cost at
//! ep 8, at ep 64?", which one imbalance number cannot: a rank holding several experts
//! averages their skew away, a rank holding one does not.
//!
//! The file is a CSV with a header, `#` lines ignored, in one of two forms:
//!
//! | form | columns | meaning |
//! |---|---|---|
//! | tokens | `layer,expert,tokens` | tokens (or any non-negative weight) routed to one expert in one layer; an expert without a row got none |
//! | imbalance | `layer,imbalance` | the busiest expert's tokens over the mean in one layer (used as the busiest rank's, as `--moe-imbalance` is) |
//!
//! Layers are numbered from 0 in model order (Hugging Face's `model.layers.N`); every routed
//! layer needs rows, a mixture's dense first layers none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, LayoutError, Result};
use crate::limits::MAX_LAYERS;
use crate::workload::{Arch, MoeSpec};

/// The most experts a row may name and the most tokens it may give one expert in one layer.
const MAX_EXPERTS: u64 = 1 << 16;
const MAX_TOKENS: f64 = 1e15;

/// One layer's routing as the file gives it.
#[derive(Debug, Clone, PartialEq)]
enum LayerRouting {
    /// Tokens per expert index (absent: none).
    Tokens(BTreeMap<u64, f64>),
    /// The busiest expert's tokens over the mean.
    Imbalance(f64),
}

/// A routing file, checked for form; checked against a model by [`ExpertRouting::loads`].
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertRouting {
    path: PathBuf,
    /// Per layer index: its routing and the file line that first named it.
    layers: BTreeMap<u64, (LayerRouting, usize)>,
}

fn number(path: &Path, line: usize, field: &str, text: &str) -> Result<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| {
            Error::bad_file(
                path,
                format!("line {line}: {field} = {text:?}: give a finite number"),
            )
        })
}

fn index(path: &Path, line: usize, field: &str, text: &str, max: u64) -> Result<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&v| v < max)
        .ok_or_else(|| {
            Error::bad_file(
                path,
                format!("line {line}: {field} = {text:?}: give an index from 0 below {max}"),
            )
        })
}

impl ExpertRouting {
    /// Reads a routing CSV; a malformed file is an error naming the file, line and field.
    pub fn load(path: &Path) -> Result<ExpertRouting> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::parse(path, &bytes)
    }

    /// Parses a routing CSV read from `path`.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ExpertRouting> {
        let forms = "give a header of layer,expert,tokens (tokens per expert) or \
                     layer,imbalance (the busiest expert over the mean)";
        let mut reader = csv::ReaderBuilder::new()
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_reader(bytes);
        let header = reader
            .headers()
            .map_err(|e| Error::bad_file(path, format!("{e}: {forms}")))?
            .clone();
        let column = |name: &str| header.iter().position(|h| h == name);
        let (layer, expert, tokens, imbalance) = (
            column("layer"),
            column("expert"),
            column("tokens"),
            column("imbalance"),
        );
        let tokens_form = match (layer, expert, tokens, imbalance) {
            (Some(_), Some(_), Some(_), None) => true,
            (Some(_), None, None, Some(_)) => false,
            _ => {
                let found: Vec<&str> = header.iter().collect();
                return Err(Error::bad_file(
                    path,
                    format!("header {}: {forms}", found.join(",")),
                ));
            }
        };
        let layer = layer.unwrap_or_default();
        let mut layers: BTreeMap<u64, (LayerRouting, usize)> = BTreeMap::new();
        for (i, record) in reader.records().enumerate() {
            let record = record.map_err(|e| Error::bad_file(path, format!("{e}: {forms}")))?;
            let line = record.position().map_or(i + 2, |p| p.line() as usize);
            let field = |c: Option<usize>| c.and_then(|c| record.get(c)).unwrap_or("");
            let l = index(path, line, "layer", field(Some(layer)), MAX_LAYERS)?;
            if tokens_form {
                let e = index(path, line, "expert", field(expert), MAX_EXPERTS)?;
                let t = number(path, line, "tokens", field(tokens))?;
                if !(0.0..=MAX_TOKENS).contains(&t) {
                    return Err(Error::bad_file(
                        path,
                        format!(
                            "line {line}: tokens = {}: give a count from 0 to {MAX_TOKENS:e}",
                            field(tokens)
                        ),
                    ));
                }
                let entry = layers
                    .entry(l)
                    .or_insert_with(|| (LayerRouting::Tokens(BTreeMap::new()), line));
                let LayerRouting::Tokens(experts) = &mut entry.0 else {
                    unreachable!("a tokens file holds token rows only")
                };
                if experts.insert(e, t).is_some() {
                    return Err(Error::bad_file(
                        path,
                        format!("line {line}: layer {l}, expert {e} given twice: keep one row"),
                    ));
                }
            } else {
                let f = number(path, line, "imbalance", field(imbalance))?;
                if layers
                    .insert(l, (LayerRouting::Imbalance(f), line))
                    .is_some()
                {
                    return Err(Error::bad_file(
                        path,
                        format!("line {line}: layer {l} given twice: keep one row"),
                    ));
                }
            }
        }
        if layers.is_empty() {
            return Err(Error::bad_file(path, format!("holds no rows: {forms}")));
        }
        Ok(ExpertRouting {
            path: path.to_path_buf(),
            layers,
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`ExpertRouting::loads`] for `arch`, which must be a mixture of experts whose layout
    /// sets no other router `imbalance` than 1 (one skew for every layer).
    pub fn model_loads(
        &self,
        arch: &Arch,
        imbalance: f64,
        ep: u64,
        capacity: Option<(f64, bool)>,
    ) -> Result<Vec<f64>, LayoutError> {
        let Some(moe) = &arch.moe else {
            return Err(LayoutError::ExpertsOnDenseModel {
                model: arch.name.clone(),
            });
        };
        if imbalance != 1.0 {
            return Err(LayoutError::RoutingWithImbalance { value: imbalance });
        }
        self.loads(moe, arch.layers, ep, capacity)
    }

    /// Per transformer layer of a model with `layers` layers and experts `moe`, the busiest
    /// expert-parallel rank's routed tokens over the mean rank's under `ep` ranks, with an
    /// expert capacity (tokens beyond `factor` × an expert's mean dropped; with padding every
    /// expert computes exactly that): what the layer's all-to-all and expert GEMMs scale with.
    /// Dense layers read 1.
    pub fn loads(
        &self,
        moe: &MoeSpec,
        layers: u64,
        ep: u64,
        capacity: Option<(f64, bool)>,
    ) -> Result<Vec<f64>, LayoutError> {
        let bad = |message: String| LayoutError::Routing {
            path: self.path.clone(),
            message,
        };
        if let Some((&l, &(_, line))) = self.layers.range(layers..).next() {
            return Err(bad(format!(
                "line {line}: layer {l}: the model has {layers} layers: give layers 0 to {}",
                layers - 1
            )));
        }
        if let Some((&l, &(_, line))) = self.layers.iter().find(|(&l, _)| !moe.has_experts(l)) {
            return Err(bad(format!(
                "line {line}: layer {l} has a dense MLP (no router): drop its rows; the \
                 layers with experts are {}",
                moe.expert_layers_text(layers)
            )));
        }
        let max = moe.experts as f64 / moe.top_k as f64;
        (0..layers)
            .map(|l| {
                if !moe.has_experts(l) {
                    return Ok(1.0);
                }
                let Some((routing, line)) = self.layers.get(&l) else {
                    return Err(bad(format!(
                        "no rows for layer {l}: give every layer with experts, {}",
                        moe.expert_layers_text(layers)
                    )));
                };
                match routing {
                    LayerRouting::Imbalance(f) => {
                        if !(1.0..=max).contains(f) {
                            return Err(bad(format!(
                                "line {line}: imbalance = {f}: give the busiest expert's \
                                 tokens over the mean, between 1 and {max} (experts / top-k)"
                            )));
                        }
                        Ok(load_under_capacity(*f, capacity))
                    }
                    LayerRouting::Tokens(tokens) => {
                        if let Some((&e, _)) = tokens.range(moe.experts..).next() {
                            return Err(bad(format!(
                                "layer {l}, expert {e}: the model has {} experts: give \
                                 experts 0 to {}",
                                moe.experts,
                                moe.experts - 1
                            )));
                        }
                        // a token's k copies go to k different experts: no expert gets
                        // more than 1/k of them
                        let total: f64 = tokens.values().sum();
                        let most = total / moe.top_k as f64;
                        if let Some((&e, &t)) =
                            tokens.iter().find(|(_, &t)| t > most * (1.0 + 1e-9))
                        {
                            return Err(bad(format!(
                                "layer {l}, expert {e}: {t} of the layer's {total} routed tokens, \
                                 more than 1/top-k ({most}): each token goes to {} different \
                                 experts; give counts of routed tokens per expert",
                                moe.top_k
                            )));
                        }
                        rank_load(tokens, moe.experts, ep, capacity).ok_or_else(|| {
                            bad(format!(
                                "line {line}: layer {l} routes no tokens: give each routed \
                                 layer's tokens per expert"
                            ))
                        })
                    }
                }
            })
            .collect()
    }
}

/// The busiest expert's `load` (over the mean) under a capacity: cut at it when tokens beyond
/// it are dropped, the capacity itself when every expert's input is padded to it.
pub fn load_under_capacity(load: f64, capacity: Option<(f64, bool)>) -> f64 {
    match capacity {
        None => load,
        Some((capacity, false)) => load.min(capacity),
        Some((capacity, true)) => capacity,
    }
}

/// The busiest of `ep` ranks' tokens over the mean rank's, each rank holding a contiguous
/// block of experts / ep experts, each expert's tokens cut at (or, padded, set to) the
/// capacity; `None` when no tokens are routed.
fn rank_load(
    tokens: &BTreeMap<u64, f64>,
    experts: u64,
    ep: u64,
    capacity: Option<(f64, bool)>,
) -> Option<f64> {
    let total: f64 = tokens.values().sum();
    if total <= 0.0 {
        return None;
    }
    let mean = total / experts as f64;
    let computed = |t: f64| match capacity {
        None => t,
        Some((c, false)) => t.min(c * mean),
        Some((c, true)) => c * mean,
    };
    let per_rank = experts / ep;
    let busiest = (0..ep)
        .map(|r| {
            (r * per_rank..(r + 1) * per_rank)
                .map(|e| computed(tokens.get(&e).copied().unwrap_or(0.0)))
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    Some(busiest / (total / ep as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(experts: u64, top_k: u64, dense_layers: u64) -> MoeSpec {
        MoeSpec {
            experts,
            top_k,
            expert_ffn: 1024,
            shared_experts: 0,
            shared_ffn: None,
            dense_layers,
            every: 1,
            offset: 0,
            groups: 0,
            topk_groups: 0,
        }
    }

    fn parse(text: &str) -> Result<ExpertRouting> {
        ExpertRouting::parse(Path::new("routing.csv"), text.as_bytes())
    }

    /// Why a file that parses does not fit `m`'s `layers` layers on `ep` ranks.
    fn misfit(text: &str, m: &MoeSpec, layers: u64, ep: u64) -> String {
        let routing = parse(text).unwrap();
        routing.loads(m, layers, ep, None).unwrap_err().to_string()
    }

    #[test]
    fn the_busiest_rank_averages_its_experts() {
        // 4 experts: one hot (40), three at 20: mean 25
        let r = parse("layer,expert,tokens\n0,0,40\n0,1,20\n0,2,20\n0,3,20\n").unwrap();
        let m = moe(4, 1, 0);
        let at = |ep, cap| r.loads(&m, 1, ep, cap).unwrap()[0];
        assert_eq!(at(4, None), 40.0 / 25.0);
        // two experts per rank: (40 + 20) over 50
        assert_eq!(at(2, None), 60.0 / 50.0);
        // one rank holds every expert: no imbalance at all
        assert_eq!(at(1, None), 1.0);
        // a capacity of 1.2 × the mean cuts the hot expert at 30 tokens
        assert!((at(4, Some((1.2, false))) - 1.2).abs() < 1e-12);
        // padded, every expert computes the capacity
        assert!((at(4, Some((1.5, true))) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn missing_experts_got_no_tokens_and_imbalance_rows_read_as_given() {
        let r = parse("# from a run\nlayer,expert,tokens\n0,0,30\n0,1,10\n").unwrap();
        // experts 2 and 3 got none: rank 0 of 2 holds all 40 of 40
        assert_eq!(r.loads(&moe(4, 1, 0), 1, 2, None).unwrap(), vec![2.0]);
        let r = parse("layer,imbalance\n1,1.5\n2,1.25\n").unwrap();
        assert_eq!(
            r.loads(&moe(8, 2, 1), 3, 8, Some((1.3, false))).unwrap(),
            vec![1.0, 1.3, 1.25]
        );
    }

    #[test]
    fn a_file_that_does_not_fit_the_model_names_the_line_and_fix() {
        let m = moe(4, 1, 1);

        for (text, says) in [
            ("layer,imbalance\n1,1.5\n", "no rows for layer 2"),
            ("layer,imbalance\n1,1.5\n2,1.2\n3,1.1\n", "line 4: layer 3"),
            (
                "layer,imbalance\n0,1.5\n1,1.2\n2,1.1\n",
                "layer 0 has a dense MLP",
            ),
            ("layer,imbalance\n1,9\n2,1.2\n", "between 1 and 4"),
            ("layer,expert,tokens\n1,7,1\n2,0,1\n", "4 experts"),
            ("layer,expert,tokens\n1,0,0\n2,0,1\n", "routes no tokens"),
        ] {
            let message = misfit(text, &m, 3, 2);
            assert!(message.contains(says), "{text:?}: {message}");
        }
        let two = moe(4, 2, 1);
        let message = misfit(
            "layer,expert,tokens\n1,0,3\n1,1,1\n2,0,1\n2,1,1\n",
            &two,
            3,
            2,
        );
        assert!(
            message.contains("layer 1, expert 0: 3 of the layer's 4"),
            "{message}"
        );
    }

    /// With experts in every other layer (Llama 4's odd ones) only those layers take rows.
    #[test]
    fn interleaved_dense_layers_take_no_rows() {
        let m = MoeSpec {
            every: 2,
            offset: 1,
            ..moe(8, 2, 0)
        };
        let r = parse("layer,imbalance\n1,1.5\n3,1.25\n").unwrap();
        assert_eq!(r.loads(&m, 4, 8, None).unwrap(), vec![1.0, 1.5, 1.0, 1.25]);
        let message = misfit("layer,imbalance\n1,1.5\n2,1.2\n3,1.1\n", &m, 4, 8);
        assert!(
            message.contains(
                "line 3: layer 2 has a dense MLP (no router): drop its rows; the \
                 layers with experts are 1 and 3"
            ),
            "{message}"
        );
        let message = misfit("layer,imbalance\n1,1.5\n", &m, 6, 8);
        assert!(
            message.contains("no rows for layer 3: give every layer with experts, 1, 3, … 5"),
            "{message}"
        );
    }

    #[test]
    fn malformed_files_are_refused_with_the_field() {
        for (text, says) in [
            ("layer,tokens\n0,1\n", "header layer,tokens"),
            ("layer,expert,tokens,imbalance\n", "header"),
            ("layer,expert,tokens\n", "no rows"),
            ("layer,expert,tokens\n0,0,-1\n", "tokens = -1"),
            ("layer,expert,tokens\n0,0,NaN\n", "finite"),
            ("layer,expert,tokens\n-1,0,1\n", "layer = \"-1\""),
            ("layer,expert,tokens\n0,x,1\n", "expert = \"x\""),
            ("layer,expert,tokens\n0,0,1\n0,0,2\n", "given twice"),
            ("layer,imbalance\n0,1.1\n0,1.2\n", "given twice"),
            ("layer,expert,tokens\n0,0\n", "found record with 2 fields"),
        ] {
            let message = parse(text).unwrap_err().to_string();
            assert!(message.starts_with("routing.csv"), "{message}");
            assert!(message.contains(says), "{text:?}: {message}");
        }
    }

    /// The bounds are inclusive where they should be: an expert may take exactly 1/top-k of a
    /// layer's routed tokens and a layer's imbalance be exactly experts / top-k, but not more;
    /// an expert index may be up to the most experts a file may name, less one.
    #[test]
    fn a_layer_may_reach_its_bounds_but_not_pass_them() {
        let two = moe(8, 2, 0);
        // two of eight experts take every copy: each exactly 1/top-k of the copies
        let r = parse("layer,expert,tokens\n0,0,50\n0,1,50\n").unwrap();
        assert_eq!(r.loads(&two, 1, 8, None).unwrap(), vec![4.0]);
        let r = parse("layer,imbalance\n0,4\n").unwrap();
        assert_eq!(r.loads(&two, 1, 8, None).unwrap(), vec![4.0]);
        let message = misfit("layer,imbalance\n0,4.01\n", &two, 1, 8);
        assert!(
            message.contains("between 1 and 4 (experts / top-k)"),
            "{message}"
        );
        let last = format!("layer,expert,tokens\n0,{},1\n", MAX_EXPERTS - 1);
        assert!(parse(&last).is_ok());
        let beyond = format!("layer,expert,tokens\n0,{MAX_EXPERTS},1\n");
        let message = parse(&beyond).unwrap_err().to_string();
        assert!(message.contains("from 0 below 65536"), "{message}");
    }
}
