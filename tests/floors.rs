//! Physics is a floor, and our own measurements check it: no GEMM or attention call we timed on
//! random inputs may beat the roofline at the best achievable fraction of peak its cluster file
//! sets, or every prediction of that kernel would be raised above what the GPU did. (The
//! zero-input collection is left out on purpose: zeros draw less power and run faster than
//! training data can. PyTorch's eager small kernels are left out too: the shipped models do not
//! use them, and some move fewer bytes than the kernels Megatron runs, which the work model
//! counts — the backward of an add is no kernel at all.)

use std::path::Path;

use stepcast::analytic::roofline;
use stepcast::dataset::Dataset;
use stepcast::hardware::Cluster;
use stepcast::ops::OpKind;

/// The floor a measurement must not beat, as `predict` applies it: the kind's, and for
/// FlashAttention-2 rows the cluster's FA2 fraction's where that is slower.
fn floor_us(cluster: &Cluster, m: &stepcast::dataset::Measurement) -> Option<f64> {
    let spec = &cluster.spec;
    let floor = roofline::floor_us(&m.query, &spec.gpu, &spec.achievable)?;
    let fa2 = roofline::flash_attention_2_floor_us(&m.query, &spec.gpu, &spec.achievable);
    Some(fa2.map_or(floor, |(_, slower)| floor.max(slower)))
}

fn check(dataset: &str, cluster: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = Dataset::load(&root.join(dataset)).unwrap();
    let cluster = Cluster::load(&root.join(cluster)).unwrap();
    let mut below = Vec::new();
    let mut checked = 0;
    let used = |m: &&stepcast::dataset::Measurement| {
        m.is_ok() && matches!(m.query.op, OpKind::Gemm | OpKind::FlashAttention)
    };
    for m in data.rows.iter().filter(used) {
        let Some(floor) = floor_us(&cluster, m) else {
            continue;
        };
        checked += 1;
        if m.time_us < floor {
            below.push(format!(
                "{} measured {:.1} µs, floor {:.1} µs",
                m.query, m.time_us, floor
            ));
        }
    }
    assert!(checked > 1000, "{dataset}: only {checked} rows checked");
    assert!(
        below.is_empty(),
        "{dataset}: {} of {checked} measurements beat {}'s floor (raise its `achievable:` \
         fractions):\n{}",
        below.len(),
        cluster.path.display(),
        below.join("\n")
    );
}

#[test]
fn our_h100_measurements_respect_the_dgx_h100_floors() {
    check(
        "datasets/h100-sxm/2026-11-27-spin",
        "hardware-profiles/dgx-h100.yaml",
    );
    check(
        "datasets/h100-sxm/2026-11-27",
        "hardware-profiles/dgx-h100.yaml",
    );
}

#[test]
fn our_h200_measurements_respect_the_dgx_h200_floors() {
    check(
        "datasets/h200-sxm/2026-11-27",
        "hardware-profiles/dgx-h200.yaml",
    );
}

#[test]
fn our_h100_measurements_respect_the_dgx_h200_floors() {
    // the same SM and peaks, more HBM bandwidth: no lower a floor
    check(
        "datasets/h100-sxm/2026-11-27-spin",
        "hardware-profiles/dgx-h200.yaml",
    );
}
