//! The bad-input catalogue: every way a user can get an input wrong that we know of, each run
//! through the real binary under a time limit. Every case must exit with code 2, print one
//! message that names the input (the `needles`) and says what to do, and never panic, abort or
//! hang.
//!
//! `{tmp}` in an argument is the case's scratch directory (its `files` are written there);
//! `{repo}` is the checkout; a file whose content starts with `@dgx-h100:` is the shipped DGX
//! H100 cluster file with the listed `old => new` line replacements.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{repo, write_dataset};

/// Longest a bad input may take to be refused.
const LIMIT: Duration = Duration::from_secs(20);

struct Case {
    args: &'static str,
    files: &'static [(&'static str, &'static str)],
    needles: &'static [&'static str],
}

const fn case(
    args: &'static str,
    files: &'static [(&'static str, &'static str)],
    needles: &'static [&'static str],
) -> Case {
    Case {
        args,
        files,
        needles,
    }
}

const H100: &str = "--cluster {repo}/hardware-profiles/dgx-h100.yaml";
const P: &str = "predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b";

/// A predict of llama2-7b on the DGX H100 file with `extra` flags.
macro_rules! predict {
    ($extra:literal, $($needle:literal),+) => {
        case(
            concat!("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b ", $extra),
            &[],
            &[$($needle),+],
        )
    };
}

/// A predict on a cluster file made from the DGX H100 one with one line replaced.
macro_rules! cluster {
    ($old:literal => $new:literal, $($needle:literal),+) => {
        case(
            "predict --cluster {tmp}/c.yaml --model llama2-7b --dp 8 --global-batch 64",
            &[("c.yaml", concat!("@dgx-h100:", $old, "=>", $new))],
            &["c.yaml", $($needle),+],
        )
    };
}

/// A predict of an architecture file.
macro_rules! arch {
    ($yaml:literal, $($needle:literal),+) => {
        case(
            "predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {tmp}/a.yaml --dp 8 --global-batch 64",
            &[("a.yaml", $yaml)],
            &["a.yaml", $($needle),+],
        )
    };
}

/// A predict of a Hugging Face config.json.
macro_rules! hf {
    ($json:literal, $($needle:literal),+) => {
        case(
            "predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {tmp}/config.json --dp 8 --global-batch 64",
            &[("config.json", $json)],
            &["config.json", $($needle),+],
        )
    };
}

/// Training on a dataset whose rmsnorm.csv is `csv` (meta.yaml is the synthetic one).
macro_rules! dataset {
    ($csv:literal, $($needle:literal),+) => {
        case(
            "train {tmp}/ds --out {tmp}/m",
            &[("ds/meta.yaml", "@meta"), ("ds/rmsnorm.csv", $csv)],
            &["rmsnorm.csv", $($needle),+],
        )
    };
}

/// A search of llama2-7b on the DGX H100 file with `extra` flags.
macro_rules! search {
    ($extra:literal, $($needle:literal),+) => {
        case(
            concat!("search --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b ", $extra),
            &[],
            &[$($needle),+],
        )
    };
}

/// `stepcast ettr` with every input given: step time, steps, nodes, save time, then `extra`.
macro_rules! ettr {
    ($step:literal, $steps:literal, $nodes:literal, $save:literal, $extra:literal, $($needle:literal),+) => {
        case(
            concat!("ettr --step-s ", $step, " --steps ", $steps, " --nodes ", $nodes, " --save-s ", $save, " ", $extra),
            &[],
            &[$($needle),+],
        )
    };
}

/// `stepcast bench plan` of a plan file.
macro_rules! plan {
    ($yaml:literal, $($needle:literal),+) => {
        case(
            "bench plan --plan {tmp}/plan.yaml",
            &[("plan.yaml", $yaml)],
            &["plan.yaml", $($needle),+],
        )
    };
}

const HEAD: &str = "op,dtype,phase,batch,seq,width,time_us\n";

fn cases() -> Vec<Case> {
    let _ = (H100, P, HEAD);
    vec![
        // ---- predict: the layout ----
        predict!("--tp 0 --global-batch 8", "tp must be at least 1"),
        predict!("--pp 0 --global-batch 8", "pp must be at least 1"),
        predict!("--dp 0 --global-batch 8", "dp must be at least 1"),
        predict!("--micro-batch 0 --global-batch 8", "micro-batch must be at least 1"),
        predict!("--micro-batches 0", "micro-batches per step must be at least 1"),
        predict!("--dp 8 --global-batch 64 --failures-per-node-day 0.01", "--failures-per-node-day", "--tokens N or --steps N"),
        predict!("--dp 8 --global-batch 64 --checkpoint-interval 100", "--checkpoint-interval", "--tokens N or --steps N"),
        predict!("--global-batch 0", "global batch must be at least 1"),
        predict!("--micro-batch 9223372036854775808 --dp 2 --global-batch 8", "micro-batch = 9223372036854775808", "at most"),
        predict!("--micro-batch 18446744073709551616 --global-batch 8", "--micro-batch"),
        predict!("--tp 2097152 --global-batch 8", "tp = 2097152", "at most"),
        predict!("--dp 4194304 --global-batch 8", "dp = 4194304", "at most"),
        predict!("--pp 2 --micro-batches 1000000000", "micro-batches per step = 1000000000", "at most"),
        predict!("--global-batch 18446744073709551615", "global batch = 18446744073709551615", "at most"),
        predict!("--dp 8 --global-batch 9223372036854775800", "global batch = 9223372036854775800", "at most"),
        predict!("--dp-bucket-elements 0 --dp 8 --global-batch 64", "dp-bucket-elements = 0", "40,000,000"),
        predict!("--dp-bucket-elements 1000 --dp 8 --global-batch 64", "dp-bucket-elements = 1000"),
        predict!("--dp-bucket-elements 2000000000000 --dp 8 --global-batch 64", "dp-bucket-elements = 2000000000000"),
        predict!("--tp 3 --global-batch 8", "attention heads (32)", "tp = 3", "use tp ∈"),
        predict!("--tp 64 --global-batch 8", "attention heads (32)", "tp = 64"),
        predict!("--pp 33 --global-batch 66", "32 layers cannot fill pp = 33", "pp ≤ 32"),
        predict!("--dp 3 --global-batch 8", "global batch 8", "micro-batch × dp", "multiple of 3"),
        predict!("--global-batch 8 --micro-batches 4", "either a global batch or micro-batches"),
        predict!("--tp 1", "give a global batch"),
        predict!("--global-batch 8 --seq-len 0", "seq-len must be at least 1"),
        predict!("--global-batch 8 --seq-len 99999999999", "seq-len = 99999999999", "at most"),
        predict!("--global-batch 32 --micro-batch 32 --seq-len 16777216", "tokens per micro-batch", "at most"),
        predict!("--global-batch 8 --zero 4", "zero = 4", "use 0, 1, 2 or 3"),
        predict!("--global-batch 8 --zero 300", "--zero"),
        predict!("--global-batch 8 --sequence-parallel", "sequence parallelism needs tp > 1"),
        predict!("--pp 2 --global-batch 8 --schedule interleaved", "interleaved schedule needs pp ≥ 2 and vpp ≥ 2", "--vpp"),
        predict!("--pp 2 --global-batch 8 --vpp 2 --schedule 1f1b", "vpp = 2 needs the interleaved schedule"),
        predict!("--pp 4 --global-batch 8 --vpp 3", "32 layers do not split", "vpp that divides 8"),
        predict!("--pp 4 --micro-batches 6 --vpp 2", "groups of pp = 4", "use 8"),
        predict!("--global-batch 8 --mtp-layers 9", "mtp-layers", "9"),
        predict!("--global-batch 8 --moe-capacity-factor 1.25", "llama2-7b"),
        predict!("--global-batch 8 --moe-pad-to-capacity", "--moe-capacity-factor"),
        predict!("--global-batch 8 --etp 2", "llama2-7b"),
        predict!("--global-batch 8 --mtp-layers -1", "--mtp-layers"),
        predict!("--pp 4 --global-batch 8 --vpp 2 --account-for-embedding-in-pipeline-split", "32 layers do not split", "use a pp that divides 33"),
        predict!("--pp 2 --global-batch 8 --account-for-loss-in-pipeline-split --partition neox", "counting the embedding or loss as a layer", "drop --partition neox"),
        predict!("--pp 17 --vpp 2 --global-batch 17 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", "leave a chunk without a transformer layer", "fewer chunks"),
        predict!("--pp 2 --global-batch 8 --vpp 2 --partition neox", "drop --partition neox"),
        predict!("--pp 2 --global-batch 8 --schedule zb-v --vpp 4", "zb-v schedule runs two model chunks", "give --vpp 2"),
        predict!("--pp 3 --global-batch 6 --schedule zb-v", "32 layers do not split", "use a pp that divides 16"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*16|t*17L", "--pipeline-layout \"Et*16|t*17L\"", "holds 33 layers (t), the model 32", "give"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|t*17", "loss L once, last"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|t*16|tL", "3 chunks", "pp = 2"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|(t*17L", "never closed"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((Et*16|t*16L)))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))", "nest more than 64 deep", "use fewer levels"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|t*17Lx", "'x' is not a layout symbol"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|t*99999L", "\"*99999\"", "repeat count"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|t*17L --account-for-loss-in-pipeline-split", "drop --account-for-loss-in-pipeline-split"),
        predict!("--pp 2 --global-batch 8 --pipeline-layout Et*15|t*17mL --mtp-layers 2", "places 1 multi-token-prediction", "--mtp-layers says 2"),
        predict!("--pp 33 --global-batch 66 --partition neox", "32 layers cannot fill pp = 33"),
        predict!("--pp 16 --global-batch 16 --rules paper --partition neox", "GPT-NeoX partition", "--partition uniform"),
        predict!("--global-batch 8 --overlap-param-gather true --zero 0", "--overlap-param-gather needs the distributed optimizer"),
        predict!("--global-batch 8 --overlap-param-gather", "--overlap-param-gather needs"),
        predict!("--global-batch 8 --grad-reduce-dtype fp8", "--grad-reduce-dtype fp8", "fp32, bf16 or fp16"),
        predict!("--global-batch 8 --grad-reduce-dtype fp64", "fp64", "--grad-reduce-dtype"),
        predict!("--global-batch 8 --tp-comm-overlap 1.5", "1.5", "--tp-comm-overlap"),
        predict!("--global-batch 8 --tp 2 --dp 4 --tp-comm-overlap", "--tp-comm-overlap", "--sequence-parallel"),
        predict!("--global-batch 8 --tp-comm-overlap NaN", "NaN", "--tp-comm-overlap"),
        predict!("--global-batch 8 --overlap-p2p maybe", "--overlap-p2p", "true"),
        predict!("--global-batch 8 --dtype fp7", "fp7", "bf16"),
        predict!("--global-batch 8 --rules deepspeed", "deepspeed", "megatron"),
        predict!("--global-batch 8 --schedule 2f2b", "2f2b", "1f1b"),
        predict!("--global-batch 8 --recompute some", "some", "selective"),
        predict!("--global-batch 8 --recompute-modules core_attn,mla_up_proj", "--recompute-modules", "mla_up_proj needs latent attention", "drop it"),
        predict!("--global-batch 8 --recompute-modules moe", "moe needs experts"),
        predict!("--global-batch 8 --moe-dispatcher deepep", "llama2-7b has no experts"),
        predict!("--global-batch 8 --moe-dispatcher nccl", "nccl", "alltoall"),
        predict!("--global-batch 8 --recompute full --recompute-modules mlp", "not --recompute full", "drop one"),
        predict!("--global-batch 8 --recompute-modules attention", "attention", "core_attn"),
        predict!("--global-batch 8 --rules paper --recompute-modules mlp", "paper's rules", "--rules megatron"),
        predict!("--global-batch 8 --partition random", "random", "uniform"),
        predict!("--tp -1 --global-batch 8", "--tp"),
        predict!("--tp 8 --pp 8 --dp 512 --global-batch 512", "tp·cp·pp·dp = 8·1·8·512 = 32768 GPUs", "dgx-h100 has 16384"),
        predict!("--cp 0 --dp 8 --global-batch 64", "cp must be at least 1"),
        predict!("--cp 3 --dp 2 --global-batch 64", "2·cp = 6 chunks", "seq-len 4096"),
        predict!("--tp 8 --sequence-parallel --global-batch 8 --seq-len 4100", "4100 tokens over tp = 8", "multiple of 8", "drop --sequence-parallel"),
        predict!("--cp 2 --dp 8 --global-batch 64 --nodes 1", "tp·cp·pp·dp = 1·2·1·8 = 16 GPUs", "--nodes"),
        predict!("--cp 2 --dp 4 --global-batch 64 --rules paper", "no context parallelism", "--rules megatron"),
        predict!("--cp 2 --cp-comm ring --dp 4 --global-batch 64", "ring", "p2p", "all-gather"),
        predict!("--global-batch 8 --attention-kernel fa3", "fa3", "native", "flash-attention-2"),
        predict!("--dp 8 --global-batch 64 --nodes -1", "--nodes -1", "between 1 and 1000000"),
        predict!("--dp 8 --global-batch 64 --nodes 99999999999", "--nodes 99999999999", "between 1 and 1000000"),
        predict!("--cp 1048576 --dp 8 --global-batch 64", "tp·cp·pp·dp", "GPUs"),
        predict!("--ep 2 --dp 8 --global-batch 64", "llama2-7b has no experts", "drop the expert settings"),
        arch!("name: m\nlayers: 4\nhidden: 512\nheads: 8\nvocab: 1000\nnorm: rmsnorm\nactivation: swiglu\nmoe: {experts: 8, top_k: 2, expert_ffn: 256, groups: 3, topk_groups: 1}\n", "moe.groups = 3", "dividing the 8 experts"),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --recompute selective-op", &[], &["--recompute selective-op", "mixtral-8x7b's experts", "use --recompute selective"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --rules paper", &[], &["the paper's rules have no mixture of experts", "--rules megatron"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --recompute-modules shared_experts", &[], &["--recompute-modules", "shared_experts needs shared experts", "drop it"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {tmp}/a.yaml --tp 16 --global-batch 64", &[("a.yaml", "name: odd\nlayers: 4\nhidden: 1024\nheads: 16\nffn_hidden: 1000\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n")], &["ffn_hidden (1000) is not divisible by tp = 16", "tp ∈ {1, 2, 4, 8}"]),
        predict!("--global-batch 8 --fp8-library torchao", "--fp8-library", "add --dtype fp8"),
        predict!("--global-batch 8 --fp8-param-gather", "--fp8-param-gather", "add --dtype fp8"),
        predict!("--global-batch 8 --cross-entropy numpy", "--cross-entropy", "vocab-parallel"),
        predict!("--global-batch 8 --elementwise compiled", "compiled", "fused", "eager"),
        predict!("--global-batch 8 --cuda-graphs full", "full", "layer", "moe_preprocess"),
        predict!("--global-batch 8 --cuda-graphs none,attn", "--cuda-graphs", "give it alone"),
        predict!("--global-batch 8 --cuda-graphs layer,attn", "--cuda-graphs", "whole layer"),
        predict!("--global-batch 8 --cuda-graphs moe", "--cuda-graphs", "experts", "drop it"),
        predict!("--global-batch 8 --rules paper --cuda-graphs attn", "--cuda-graphs", "paper", "--rules megatron"),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --cuda-graphs moe", &[], &["--cuda-graphs", "not padded to a capacity", "attn,moe_router,moe_preprocess", "--moe-pad-to-capacity"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --cuda-graphs moe_preprocess", &[], &["--cuda-graphs", "moe_router,moe_preprocess"]),
        case("export --format torchtitan --cluster dgx-h100 --model llama2-7b --dp 8 --global-batch 64 --zero 3 --cuda-graphs attn", &[], &["torchtitan", "CUDA graph", "without --cuda-graphs"]),
        predict!("--global-batch 8 --rules paper --cross-entropy fused", "--cross-entropy fused", "paper's rules", "--rules megatron"),
        case("export --format torchtitan --cluster dgx-h100 --model llama2-7b --dp 8 --global-batch 64 --zero 3 --cross-entropy fused", &[], &["torchtitan", "fused", "--cross-entropy pytorch"]),
        predict!("--global-batch 8 --rules paper --recompute selective-op", "--recompute selective-op", "the paper's rules", "--rules megatron"),
        predict!("--global-batch 8 --rules paper --recompute selective-layer", "--recompute selective-layer", "the paper's rules", "--rules megatron"),
        case("export --format megatron --cluster dgx-h100 --model llama2-7b --dp 8 --global-batch 64 --recompute selective-layer", &[], &["megatron", "selective-layer", "torchtitan's"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b --dp 8 --global-batch 64 --moe-routing {tmp}/r.csv", &[("r.csv", "layer,imbalance\n0,1.5\n")], &["llama2-7b has no experts", "--moe-routing"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --moe-routing {tmp}/none.csv", &[], &["none.csv", "not found"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --moe-routing {tmp}/r.csv", &[("r.csv", "layer,tokens\n0,1\n")], &["r.csv", "header layer,tokens", "layer,expert,tokens"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --moe-routing {tmp}/r.csv", &[("r.csv", "layer,expert,tokens\n0,0,1e99\n")], &["r.csv", "line 2", "tokens = 1e99"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --moe-routing {tmp}/r.csv", &[("r.csv", "layer,imbalance\n40,1.2\n")], &["r.csv", "layer 40", "32 layers"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --moe-routing {tmp}/r.csv", &[("r.csv", "layer,imbalance\n0,1.2\n")], &["r.csv", "no rows for layer 1", "0 to 31"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {repo}/tests/data/mixtral-8x7b.yaml --dp 8 --ep 8 --global-batch 64 --moe-imbalance 1.2 --moe-routing {tmp}/r.csv", &[("r.csv", "layer,imbalance\n0,1.2\n")], &["--moe-imbalance 1.2", "keep one"]),
        predict!("--moe-imbalance 1.5 --dp 8 --global-batch 64", "has no experts", "--moe-imbalance"),
        predict!("--tp 8 --dp 4096 --global-batch 4096", "32768 GPUs", "lower dp (at most 2048)"),
        predict!("--global-batch 8 --trace {tmp}/t.json --schedule closed-form", "--trace needs a simulated schedule", "--schedule 1f1b"),
        predict!("--global-batch 8 --models {tmp}/nowhere", "nowhere", "stepcast train"),
        predict!("--global-batch 8 --models {tmp}", "models.bin", "stepcast train"),
        case("predict --cluster {repo}/hardware-profiles/perlmutter.yaml --model llama2-7b --dp 4 --global-batch 8 --dtype fp8", &[], &["A100", "no fp8 tensor cores", "bf16"]),
        case("predict --cluster {repo}/hardware-profiles/mi300x.yaml --model llama2-7b --dp 8 --global-batch 64 --strict", &[], &["--strict", "roofline"]),
        case("predict --model llama2-7b --global-batch 8", &[], &["--cluster"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --global-batch 8", &[], &["--model"]),
        case("predict --cluster {tmp}/missing.yaml --model llama2-7b --global-batch 8", &[], &["missing.yaml", "not found", "hardware-profiles"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama9-1t --global-batch 8", &[], &["llama9-1t", "llama2-7b"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {tmp}/nofile.yaml --global-batch 8", &[], &["nofile.yaml"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b --global-batch 8 --tp", &[], &["--tp"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b --global-batch 8 --bogus", &[], &["--bogus"]),
        // ---- job files ----
        case("predict --job {tmp}/missing-job.yaml", &[], &["missing-job.yaml"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: [unclosed")], &["job.yaml"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: c.yaml\nmodel: llama2-7b\nparallel: {tp: 1, sizes: 2}\n")], &["job.yaml", "sizes"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: nowhere.yaml\nmodel: llama2-7b\nparallel: {dp: 8, global_batch: 64}\n")], &["nowhere.yaml", "not found"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "model: llama2-7b\nparallel: {dp: 8, global_batch: 64}\n")], &["--cluster"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: dgx-h100\nmodel: llama2-7b\nframework: \"Composer!\"\nparallel: {dp: 8, global_batch: 64}\n")], &["job.yaml", "framework", "Composer!", "e.g. composer"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: {repo}/hardware-profiles/dgx-h100.yaml\nmodel: llama2-7b\nparallel: {dp: -8, global_batch: 64}\n")], &["job.yaml", "dp"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: {repo}/hardware-profiles/dgx-h100.yaml\nmodel: llama2-7b\nparallel: {dp: 8, global_batch: 64, tp_comm_overlap: 7}\n")], &["job.yaml", "tp_comm_overlap"]),
        case("predict --job {tmp}/job.yaml", &[("job.yaml", "cluster: {repo}/hardware-profiles/dgx-h100.yaml\nmodel: {repo}/tests/data/mixtral-8x7b.yaml\nmoe_routing: routing.csv\nparallel: {dp: 8, ep: 8, global_batch: 64}\n")], &["routing.csv", "not found"]),
        // ---- cluster files ----
        cluster!("  memory_gib: 80" => "  memory_gib: 0", "gpu.memory_gib = 0", "physical range"),
        cluster!("  memory_gib: 80" => "  memory_gib: -80", "gpu.memory_gib = -80"),
        cluster!("  memory_gib: 80" => "  memory_gib: .nan", "gpu.memory_gib = NaN"),
        cluster!("  memory_gib: 80" => "  memory_gib: 1e9", "gpu.memory_gib = 1e9"),
        cluster!("  memory_gib: 80" => "  memory_gib: eighty", "memory_gib"),
        cluster!("  sm_count: 132" => "  sm_count: 0", "gpu.sm_count = 0"),
        cluster!("  sm_count: 132" => "  sm_count: -5", "sm_count"),
        cluster!("  hbm_bandwidth_gb_per_s: 3350" => "  hbm_bandwidth_gb_per_s: 1e-320", "gpu.hbm_bandwidth_gb_per_s"),
        cluster!("  hbm_bandwidth_gb_per_s: 3350" => "  hbm_bandwidth_gb_per_s: .inf", "gpu.hbm_bandwidth_gb_per_s = inf"),
        cluster!("  l2_cache_mib: 50" => "  l2_cache_mib: -1", "gpu.l2_cache_mib = -1"),
        cluster!("bf16: 989.4, fp8" => "bf16: 0, fp8", "gpu.peak_dense_tflops.bf16 = 0"),
        cluster!("fp8: 1978.9}" => "fp8: 1e300}", "gpu.peak_dense_tflops.fp8"),
        cluster!("gpus_per_node: 8" => "gpus_per_node: 0", "gpus_per_node = 0"),
        cluster!("gpus_per_node: 8" => "gpus_per_node: 5000", "gpus_per_node = 5000"),
        cluster!("nodes: 2048" => "nodes: 0", "nodes = 0"),
        cluster!("nodes: 2048" => "nodes: 9999999999", "nodes"),
        cluster!("    bandwidth_gb_per_s: 450" => "    bandwidth_gb_per_s: 1e-320", "network.intra_node.bandwidth_gb_per_s"),
        cluster!("    bandwidth_gb_per_s: 450" => "    bandwidth_gb_per_s: -450", "network.intra_node.bandwidth_gb_per_s = -450"),
        cluster!("    latency_us: 2" => "    latency_us: 1e308", "network.intra_node.latency_us"),
        cluster!("    latency_us: 3" => "    latency_us: -3", "network.inter_node.latency_us = -3"),
        cluster!("    nics_per_node: 8" => "    nics_per_node: 0", "nics_per_node = 0"),
        cluster!("    bandwidth_gbit_per_s_per_nic: 400" => "    bandwidth_gbit_per_s_per_nic: 0", "bandwidth_gbit_per_s_per_nic = 0"),
        cluster!("  failures_per_node_per_day: 0.0038" => "  failures_per_node_per_day: 0", "failures_per_node_per_day = 0"),
        cluster!("  failures_per_node_per_day: 0.0038" => "  failures_per_node_per_day: 40", "failures_per_node_per_day = 40"),
        cluster!("    - {level: process, share: 0.3, seconds: 141}" => "    - {level: process, share: 3, seconds: 141}", "recovery process share = 3"),
        cluster!("    - {level: process, share: 0.3, seconds: 141}" => "    - {level: process, share: 0.3, seconds: -141}", "recovery process seconds = -141"),
        cluster!("  first_start_s: 600" => "  first_start_s: -1", "first_start_s = -1"),
        cluster!("name: dgx-h100" => "name: dgx-h100\ncolour: green", "colour"),
        cluster!("  dir: ../models/h100-sxm" => "  dir: ../no-models-here", "no-models-here", "stepcast train"),
        cluster!("  collectives_from: ../models/h100-aiconfigurator" => "  collectives_from: ../models/no-collectives", "no-collectives", "models.collectives_from", "remove collectives_from"),
        cluster!("  transfer_from: [../models/vista, ../models/perlmutter]" => "  transfer_from: [../models/no-transfer]", "no-transfer", "models.transfer_from", "remove them from transfer_from"),
        cluster!("  dir: ../models/h100-sxm" => "  dir: ../models/h100-sxm\n  calibration_from: dgx-h100", "models.calibration_from is 'dgx-h100'", "give the name of another cluster"),
        cluster!("  dir: ../models/h100-sxm" => "  dir: ../models/h100-sxm\n  calibration_from: ../secrets/x", "models.calibration_from is '../secrets/x'", "give the name of another cluster"),
        cluster!("gpus_per_node: 8" => "efficiency: {compute: 0, memory: 0.8, kernel_launch_us: 4, network: 0.85}\ngpus_per_node: 8", "efficiency.compute = 0"),
        cluster!("gpus_per_node: 8" => "efficiency: {compute: 0.7, memory: 1.5, kernel_launch_us: 4, network: 0.85}\ngpus_per_node: 8", "efficiency.memory = 1.5"),
        cluster!("gpus_per_node: 8" => "efficiency: {compute: 0.7, memory: 0.8, kernel_launch_us: -4, network: 0.85}\ngpus_per_node: 8", "efficiency.kernel_launch_us = -4"),
        cluster!("gpus_per_node: 8" => "memory: {framework_gib: -2, communicator_gib: 0.5}\ngpus_per_node: 8", "memory.framework_gib = -2"),
        cluster!("gpus_per_node: 8" => "storage: {checkpoint_write_gb_per_s_per_node: 0}\ngpus_per_node: 8", "checkpoint_write_gb_per_s_per_node = 0"),
        case("predict --cluster {tmp}/c.yaml --model llama2-7b --global-batch 8", &[("c.yaml", "")], &["c.yaml"]),
        case("predict --cluster {tmp}/c.yaml --model llama2-7b --global-batch 8", &[("c.yaml", "name: x\n")], &["c.yaml", "gpu"]),
        case("predict --cluster {tmp}/c.yaml --model llama2-7b --global-batch 8", &[("c.yaml", "\u{0}\u{1}binary")], &["c.yaml"]),
        // ---- architecture files ----
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\ndropout: on\n", "dropout", "\"on\"", "write true or false"),
        arch!("name: a\nlayers: 0\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "layers must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nsliding_window: 0\n", "sliding_window must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\ncausal_blocks: half\n", "causal_blocks"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nsliding_window: 512\nglobal_attention_every: 0\n", "global_attention_every must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nchunked_attention: true\n", "chunked_attention: true", "set sliding_window"),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model {tmp}/c.json --cp 2 --dp 4 --global-batch 8 --seq-len 8192", &[("c.json", "{\"model_type\":\"llama4_text\",\"hidden_size\":1024,\"intermediate_size\":1024,\"intermediate_size_mlp\":4096,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"num_hidden_layers\":8,\"vocab_size\":32000,\"num_local_experts\":8,\"num_experts_per_tok\":1,\"attention_chunk_size\":2048}")], &["window of 2048 tokens (sliding or chunked)", "--cp 1"]),
        arch!("name: a\nlayers: 4\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nmoe: {experts: 8, top_k: 2, expert_ffn: 1024, dense_layers: 4}\n", "moe.dense_layers = 4", "fewer dense"),
        arch!("name: a\nlayers: 4\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nmoe: {experts: 8, top_k: 2, expert_ffn: 1024, every: 0}\n", "moe.every = 0", "give every from 1"),
        arch!("name: a\nlayers: 4\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nmoe: {experts: 8, top_k: 2, expert_ffn: 1024, every: 2, offset: 2}\n", "offset = 2", "offset below it"),
        arch!("name: a\nlayers: 4\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nmoe: {experts: 8, top_k: 2, expert_ffn: 1024, dense_layers: 2, every: 2, offset: 1, extra: 1}\n", "unknown field `extra`"),
        arch!("name: a\nlayers: 4\nhidden: 4096\nheads: 32\nkv_heads: 8\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nmla: {kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128}\n", "kv_heads (8) must equal heads (32)"),
        arch!("name: a\nlayers: 4\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nmla: {kv_lora_rank: 0, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128}\n", "mla.kv_lora_rank = 0"),
        arch!("name: a\nlayers: 1000000\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "layers = 1000000", "at most"),
        arch!("name: a\nlayers: 32\nhidden: 0\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "hidden must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 0\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "heads must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 30\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "multiple of heads (30)"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nkv_heads: 0\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "kv_heads must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nkv_heads: 5\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "multiple of kv_heads (5)"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 0\nnorm: rmsnorm\nactivation: swiglu\n", "vocab must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 18446744073709551615\nnorm: rmsnorm\nactivation: swiglu\n", "vocab = 18446744073709551615"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nffn_hidden: 0\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "ffn_hidden must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nffn_hidden: 99999999999\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "ffn_hidden = 99999999999"),
        arch!("name: a\nlayers: 32\nhidden: 4194304\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "hidden = 4194304"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nseq_len: 0\n", "seq_len must be at least 1"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nseq_len: 99999999999\n", "seq_len = 99999999999"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: batchnorm\nactivation: swiglu\n", "batchnorm"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: relu\n", "relu"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nexperts: 8\n", "experts"),
        arch!("name: a\nlayers: 32\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "hidden"),
        arch!("name: a\nlayers: -32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\n", "layers"),
        arch!("[1, 2, 3]", "a.yaml"),
        // a text file given as the model: YAML reads it as one string, quoted back cut short
        arch!("root:x:0:0:root:/root:/bin/bash daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin bin:x:2:2:bin:/bin:/usr/sbin/nologin\n", "\"root:x:0:0:root", "(116 characters)", "expected struct ArchSpec"),
        // ---- Hugging Face config.json ----
        hf!("{not json", "not valid JSON"),
        hf!("{\"hidden_size\": 4096}", "model_type"),
        hf!("{\"model_type\": \"mamba\"}", "mamba", "YAML"),
        hf!("{\"model_type\": \"llama\", \"hidden_size\": 4096}", "num_hidden_layers"),
        hf!("{\"model_type\": \"llama\", \"num_hidden_layers\": -2, \"hidden_size\": 4096, \"num_attention_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 32000}", "num_hidden_layers", "positive integer"),
        hf!("{\"model_type\": \"llama\", \"num_hidden_layers\": \"32\", \"hidden_size\": 4096, \"num_attention_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 32000}", "num_hidden_layers"),
        hf!("{\"model_type\": \"llama\", \"num_hidden_layers\": 32, \"hidden_size\": 4096, \"num_attention_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 32000, \"hidden_act\": \"gelu\"}", "hidden_act", "gelu"),
        hf!("{\"model_type\": \"llama\", \"num_hidden_layers\": 32, \"hidden_size\": 4096, \"num_attention_heads\": 30, \"intermediate_size\": 11008, \"vocab_size\": 32000}", "multiple of heads (30)"),
        hf!("{\"model_type\": \"llama\", \"num_hidden_layers\": 32, \"hidden_size\": 4096, \"num_attention_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 1e30}", "vocab_size"),
        hf!("{\"model_type\": \"llama\", \"num_hidden_layers\": 99999999, \"hidden_size\": 4096, \"num_attention_heads\": 32, \"intermediate_size\": 11008, \"vocab_size\": 32000}", "layers = 99999999"),
        hf!("{\"model_type\": \"gpt2\", \"n_layer\": 12, \"n_head\": 12, \"vocab_size\": 50257}", "n_embd"),
        hf!("{\"model_type\": \"gpt_neox\", \"num_hidden_layers\": 12, \"hidden_size\": 768, \"num_attention_heads\": 12, \"vocab_size\": 50257}", "intermediate_size"),
        hf!("", "not valid JSON"),
        hf!("{\"model_type\": \"gemma2\", \"num_hidden_layers\": 42, \"hidden_size\": 3584, \"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"head_dim\": 256, \"intermediate_size\": 14336, \"vocab_size\": 256000, \"final_logit_softcapping\": 0}", "final_logit_softcapping", "positive number"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\npost_norms: sometimes\n", "post_norms"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\npre_norms: false\n", "pre_norms: false", "post_norms: true"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nqk_norm_span: projection\n", "qk_norm_span", "qk_norm: true"),
        arch!("name: a\nlayers: 32\nhidden: 4096\nheads: 32\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nqk_norm: true\nqk_norm_span: full\n", "qk_norm_span", "projection"),
        hf!("{\"model_type\": \"mpt\", \"d_model\": 4096, \"n_heads\": 32, \"n_layers\": 32, \"vocab_size\": 50432, \"attn_config\": {\"alibi\": true, \"clip_qkv\": 8}}", "attn_config.clip_qkv", "not costed"),
        hf!("{\"model_type\": \"mpt\", \"d_model\": 4096, \"n_heads\": 32, \"n_layers\": 32, \"vocab_size\": 50432, \"expansion_ratio\": 1e9}", "expansion_ratio", "between 0.01 and 1000"),
        hf!("{\"model_type\": \"mpt\", \"d_model\": 4096, \"n_heads\": 32, \"n_layers\": 32, \"vocab_size\": 50432, \"attn_config\": {\"attn_type\": \"grouped_query_attention\", \"kv_n_heads\": \"8\"}}", "attn_config.kv_n_heads", "positive integer"),
        hf!("{\"model_type\": \"mpt\", \"d_model\": 4096, \"n_heads\": 32, \"n_layers\": 32, \"vocab_size\": 50432, \"attn_config\": \"flash\"}", "attn_config", "must be an object"),
        hf!("{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", \"hidden_size\": 2560}}", "text_config", "gemma3_text"),
        // ---- datasets ----
        case("train {tmp}/nope --out {tmp}/m", &[], &["nope", "not found"]),
        case("train {tmp}/bare --out {tmp}/m", &[("bare/x.txt", "")], &["meta.yaml"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "schema_version: [")], &["meta.yaml"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta")], &["ds", "no <op>.csv files"]),
        dataset!("op,dtype,phase,batch,seq,width\nrmsnorm,fp16,fwd,1,2,3\n", "missing column 'time_us'"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,NaN\n", "rmsnorm.csv:2", "time_us = NaN", "µs"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,-5\n", "rmsnorm.csv:2", "time_us = -5"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,0\n", "rmsnorm.csv:2", "time_us = 0"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,1e-300\n", "rmsnorm.csv:2", "time_us = 1e-300"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,1e300\n", "rmsnorm.csv:2", "time_us = 1e300"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,18446744073709551615,2,3,5\n", "rmsnorm.csv:2", "batch = 18446744073709551615", "at most"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,0,2,3,5\n", "rmsnorm.csv:2", "batch must be at least 1"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1.5,2,3,5\n", "rmsnorm.csv:2", "batch = '1.5'"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\nrmsnorm,fp16,fw", "rmsnorm.csv:3", "truncated"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,sideways,1,2,3,5\n", "unknown phase 'sideways'"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp9,fwd,1,2,3,5\n", "unknown dtype 'fp9'"),
        dataset!("op,dtype,phase,batch,seq,width,time_us\nlinear1,fp16,fwd,1,2,3,5\n", "linear1", "gemm"),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta"), ("ds/rmsnorm.csv", "op,dtype,phase,batch,seq,width,time_us\n")], &["ds", "no measured rows", "stepcast bench collect"]),
        dataset!("op,dtype,phase,batch,width,time_us\nrmsnorm,fp16,fwd,1,3,5\n", "seq"),
        dataset!("\u{feff}\u{0}\u{0}garbage", "rmsnorm.csv"),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta"), ("ds/all_reduce.csv", "op,dtype,phase,bytes,ranks,nodes,gpus_per_node,time_us\nall_reduce,fp16,none,1024,3,2,1,5\n")], &["all_reduce.csv:2", "ranks = 3"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta"), ("ds/all_reduce.csv", "op,dtype,phase,bytes,ranks,nodes,gpus_per_node,time_us\nall_reduce,fp16,none,1024,1,1,1,5\n")], &["all_reduce.csv:2", "at least 2 ranks"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta"), ("ds/flash_attention.csv", "op,dtype,phase,batch,seq_q,seq_kv,heads,kv_heads,head_dim,causal,time_us\nflash_attention,fp16,fwd,1,128,128,8,8,64,2,5\n")], &["flash_attention.csv:2", "causal"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta"), ("ds/flash_attention.csv", "op,dtype,phase,batch,seq_q,seq_kv,heads,kv_heads,head_dim,causal,time_us\nflash_attention,fp16,fwd,1,128,128,6,4,64,1,5\n")], &["flash_attention.csv:2", "multiple of kv_heads"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta-collected"), ("ds/rmsnorm.csv", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\nrmsnorm,fp16,fwd,1,2,3,6\n")], &["rmsnorm.csv:3", "already measured on line 2", "two collectors"]),
        case("train {tmp}/ds --out {tmp}/m", &[("ds/meta.yaml", "@meta-bad-gpu")], &["meta.yaml", "gpu"]),
        case("datasets show {tmp}/nope", &[], &["nope", "not found"]),
        case("datasets import --format aiconfigurator {tmp}/nope --out {tmp}/o", &[], &["nope"]),
        case("datasets import --format perfdb {tmp} --out {tmp}/o", &[], &["perfdb", "aiconfigurator"]),
        case("datasets import --format estimate-train-time {tmp}/rel --system Frontier --out {tmp}/o", &[("rel/Perlmutter/x", "")], &["Frontier"]),
        // ---- runs import: a NeMo 2 log and its NeMo-Run task ----
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "a: [")], &["c.yaml", "not YAML"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "_target_: nemo_run.Script\n")], &["c.yaml", "no `trainer:` section", "_config.yaml"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "trainer:\n  strategy:\n    _target_: nemo.lightning.FSDP2Strategy\n")], &["c.yaml", "\"FSDP2Strategy\"", "MegatronStrategy"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "trainer:\n  devices: auto\n  strategy:\n    _target_: nemo.lightning.MegatronStrategy\n")], &["c.yaml", "trainer.devices (auto)", "--gpus N"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --gpus 0 --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "trainer:\n  devices: auto\n")], &["--gpus", "0"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "trainer:\n  devices: 8\n  plugins:\n    _target_: nemo.lightning.MegatronMixedPrecision\n    precision: 64-true\n  strategy:\n    _target_: nemo.lightning.MegatronStrategy\n")], &["c.yaml", "trainer.plugins.precision \"64-true\""]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", ""), ("c.yaml", "model:\n  config:\n    _target_: nemo.collections.llm.MistralConfig7B\ntrainer:\n  devices: 8\n  plugins:\n    _target_: nemo.lightning.MegatronMixedPrecision\n    precision: bf16-mixed\n  strategy:\n    _target_: nemo.lightning.MegatronStrategy\n")], &["c.yaml", "\"MistralConfig7B\"", "--model"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", "Training epoch 0, iteration 5/50 | train_step_timing in s: 1.5\n"), ("c.yaml", "data:\n  global_batch_size: 8\n  micro_batch_size: 1\n  seq_length: 4096\nmodel:\n  config:\n    _target_: nemo.collections.llm.Llama3Config8B\n    num_layers: 40\ntrainer:\n  devices: 8\n  plugins:\n    _target_: nemo.lightning.MegatronMixedPrecision\n    precision: bf16-mixed\n  strategy:\n    _target_: nemo.lightning.MegatronStrategy\n")], &["c.yaml", "num_layers 40 where llama3-8b has 32", "--model"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", "Training epoch 0, iteration 5/50 | train_step_timing in s: 1.5\n"), ("c.yaml", "data:\n  global_batch_size: 8\n  micro_batch_size: 1\n  seq_length: 4096\nmodel:\n  config:\n    _target_: nemo.collections.llm.Llama3Config8B\ntrainer:\n  devices: 8\n  plugins:\n    _target_: nemo.lightning.MegatronMixedPrecision\n    precision: bf16-mixed\n  strategy:\n    _target_: nemo.lightning.MegatronStrategy\n")], &["n.log", "no step line past iteration 10", "--warmup-iterations"]),
        case("runs import --format nemo {tmp}/n.log --config {tmp}/c.yaml --cluster dgx-h100 --out {tmp}/r.csv", &[("n.log", "Training epoch 0, iteration 20/50 | train_step_timing in s: 1.5\n"), ("c.yaml", "data:\n  global_batch_size: 12\n  micro_batch_size: 1\n  seq_length: 4096\nmodel:\n  config:\n    _target_: nemo.collections.llm.Llama3Config8B\ntrainer:\n  devices: 8\n  plugins:\n    _target_: nemo.lightning.MegatronMixedPrecision\n    precision: bf16-mixed\n  strategy:\n    _target_: nemo.lightning.MegatronStrategy\n")], &["c.yaml", "global_batch_size 12", "micro_batch_size 1 × data parallelism 8", "the configuration is the one"]),
        // ---- models directories ----
        case("models show {tmp}/nope", &[], &["nope", "models directory not found"]),
        case("models show {tmp}/m", &[("m/manifest.json", "{\"format_version\": 7, \"feature_schema_version\": 1}")], &["manifest.json", "version 7", "retrain"]),
        case("models show {tmp}/m", &[("m/manifest.json", "[]")], &["manifest.json"]),
        case("eval {tmp}/m {tmp}/ds", &[("m/models.bin", "stepcast-models\n\u{3}\u{0}\u{0}\u{0}"), ("ds/meta.yaml", "@meta"), ("ds/rmsnorm.csv", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\n")], &["models.bin", "retrain"]),
        case("eval {tmp}/m {tmp}/ds", &[("m/models.bin", "not a models file at all, but long enough to have a header"), ("ds/meta.yaml", "@meta"), ("ds/rmsnorm.csv", "op,dtype,phase,batch,seq,width,time_us\nrmsnorm,fp16,fwd,1,2,3,5\n")], &["models.bin", "not a stepcast models file"]),
        case("predict --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b --dp 8 --global-batch 64 --models {tmp}/m", &[("m/models.bin", "stepcast-models\n")], &["models.bin", "too short"]),
        // ---- memory ----
        case("memory --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b --tp 3 --global-batch 8", &[], &["tp = 3"]),
        case("memory --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama2-7b --global-batch 8 --dp 0", &[], &["dp must be at least 1"]),
        case("memory --cluster {repo}/hardware-profiles/dgx-h100.yaml --model nothing --global-batch 8", &[], &["nothing"]),
        // ---- search ----
        search!("--gpus 0 --global-batch 64", "--gpus and --global-batch must be at least 1"),
        search!("--gpus 8 --global-batch 0", "--gpus and --global-batch must be at least 1"),
        search!("--gpus 32768 --global-batch 64", "32768 GPUs asked for", "dgx-h100 has 16384"),
        search!("--gpus 8 --global-batch 64 --tp 0,3", "--tp 0", "divisors of 8"),
        search!("--gpus 8 --global-batch 64 --tp 3", "--tp 3 does not divide --gpus 8", "1, 2, 4, 8"),
        search!("--gpus 8 --global-batch 64 --pp 0", "--pp 0", "divisors of 8"),
        search!("--gpus 8 --global-batch 64 --micro-batch 0", "--micro-batch 0", "from 1"),
        search!("--gpus 8 --global-batch 64 --zero 5", "--zero 5", "0, 1, 2 or 3"),
        search!("--gpus 8 --global-batch 64 --max-vpp 0", "--max-vpp 0", "at least 2"),
        search!("--gpus 8 --global-batch 64 --objective e2e", "--tokens or --steps"),
        search!("--gpus 8 --global-batch 64 --objective fastest", "fastest", "e2e"),
        search!("--gpus 8 --global-batch 64 --tokens -5", "--tokens = -5"),
        search!("--gpus 8 --global-batch 64 --recovery-s 60", "--recovery-s", "--tokens N or --steps N"),
        search!("--gpus 8 --global-batch 64 --tp-comm-overlap 2", "--tp-comm-overlap", "2"),
        search!("--gpus 8 --global-batch 64 --schedule 1f1b,2f2b", "2f2b"),
        search!("--gpus 8 --global-batch 7 --micro-batch 2", "global batch 7", "passed the rules", "micro-batch × dp"),
        case("search --cluster {repo}/hardware-profiles/perlmutter.yaml --model llama2-7b --gpus 8 --global-batch 64 --dtype fp8", &[], &["A100", "fp8", "bf16"]),
        case("search --cluster {repo}/hardware-profiles/dgx-h100.yaml --model llama3-405b --gpus 8 --global-batch 8", &[], &["no layout of llama3-405b fits", "use more GPUs"]),
        // ---- ettr ----
        ettr!("0", "1000", "32", "2", "", "step time = 0", "physical range"),
        ettr!("1e-300", "1000", "32", "2", "", "step time = 1e-300", "physical range"),
        ettr!("NaN", "1000", "32", "2", "", "step time = NaN"),
        ettr!("28", "0", "32", "2", "", "steps = 0"),
        ettr!("28", "1e300", "32", "2", "", "steps = 1e300"),
        ettr!("28", "1000", "0", "2", "", "nodes = 0"),
        ettr!("28", "1000", "32", "-1", "", "checkpoint save time = -1"),
        ettr!("28", "1000", "32", "2", "--failures-per-node-day 0", "positive rate"),
        ettr!("28", "1000", "32", "2", "--failures-per-node-day 100", "failures_per_node_per_day = 100"),
        ettr!("28", "1000", "32", "2", "--recovery-s -3", "zero or positive"),
        ettr!("28", "1000", "32", "2", "--checkpoint-interval 0", "checkpoint interval 0", "between 1 and"),
        ettr!("28", "1000", "32", "2", "--checkpoint-interval 5000", "checkpoint interval 5000", "between 1 and"),
        ettr!("28", "1000", "32", "2", "--first-start-s -1", "first-start-s -1"),
        ettr!("28", "1000", "10000", "2", "--failures-per-node-day 10", "recovering"),
        case("ettr --steps 10 --nodes 2 --save-s 1", &[], &["--step-s"]),
        // ---- export, completions, man ----
        case("export --format deepspeed --cluster dgx-h100 --model llama2-7b", &[], &["deepspeed", "megatron, nemo, torchtitan"]),
        case("export --format megatron --cluster dgx-h100 --model llama2-7b --dp 8 --global-batch 64 --zero 3", &[], &["ZeRO 1", "--zero 1"]),
        case("export --format megatron --cluster dgx-h100 --model llama2-7b --dp 8 --global-batch 64 --rules paper", &[], &["paper", "--rules megatron"]),
        case("export --format torchtitan --cluster dgx-h100 --model llama2-7b --tp 2 --dp 4 --global-batch 64 --zero 3", &[], &["sequence", "--sequence-parallel"]),
        case("export --format nemo --cluster dgx-h100 --model llama2-7b --tp 2 --dp 6 --global-batch 60", &[], &["12 GPUs", "whole nodes of 8"]),
        case("export --format megatron --cluster dgx-h100 --nodes 2 --model {repo}/tests/data/mixtral-8x7b.yaml --tp 2 --ep 4 --dp 8 --global-batch 64", &[], &["megatron", "expert and tensor parallelism", "--sequence-parallel"]),
        case("export --format nemo --cluster dgx-h100 --model {tmp}/kv4.yaml --tp 8 --global-batch 64", &[("kv4.yaml", "name: kv4\nlayers: 4\nhidden: 4096\nheads: 32\nkv_heads: 4\nffn_hidden: 14336\nvocab: 32000\nnorm: rmsnorm\nactivation: swiglu\nseq_len: 4096\n")], &["nemo", "num_query_groups (4)", "tp ∈ {1, 2, 4}"]),
        case("export --format megatron --from-search {tmp}/s.json", &[("s.json", "{\"rows\": 3}")], &["s.json", "not a search's JSON", "--json FILE"]),
        case("export --format megatron --from-search {tmp}/s.json --tp 2", &[("s.json", "{}")], &["--from-search", "drop --job, --tp"]),
        case("export --format megatron --from-search {tmp}/s.json --rank 3", &[("s.json", "{\"rows\": []}")], &["--rank 3", "predicted 0 layouts"]),
        case("completions tcsh", &[], &["tcsh", "bash"]),
        case("man --out {tmp}/nowhere", &[], &["nowhere", "mkdir"]),
        // ---- bench plan ----
        plan!("name: p\ndtypes: []\nseed: 0\n", "dtypes is empty"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ngrid: {configs: 4, tp: [], micro_batch: [1], seq: {from: 512, to: 1024, step: 512}, hidden: {from: 1024, to: 2048, step: 512}, heads: {from: 8, to: 16, step: 8}, ffn_ratio: [4]}\n", "grid.tp is empty"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ngrid: {configs: 4, tp: [1], micro_batch: [1], seq: {from: 512, to: 1024, step: 0}, hidden: {from: 1024, to: 2048, step: 512}, heads: {from: 8, to: 16, step: 8}, ffn_ratio: [4]}\n", "grid.seq", "step ≥ 1"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ngrid: {configs: 4, tp: [1], micro_batch: [1], seq: {from: 1, to: 100000000000, step: 1}, hidden: {from: 1024, to: 2048, step: 512}, heads: {from: 8, to: 16, step: 8}, ffn_ratio: [4]}\n", "grid.seq spans", "raise step"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ngrid: {configs: 4, tp: [1], micro_batch: [1], seq: {from: 2048, to: 1024, step: 512}, hidden: {from: 1024, to: 2048, step: 512}, heads: {from: 8, to: 16, step: 8}, ffn_ratio: [4]}\n", "grid.seq", "from ≤ to"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ncollectives: {ops: [all_reduce], min_bytes: 1024, max_bytes: 4096, factor: 1}\n", "factor ≥ 2"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ncollectives: {ops: [gemm], min_bytes: 1024, max_bytes: 4096, factor: 2}\n", "gemm, not a collective"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ncollectives: {ops: [], min_bytes: 1024, max_bytes: 4096, factor: 2}\n", "collectives.ops is empty", "at least one collective"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\ngrid: {configs: 4000000000, tp: [1], micro_batch: [1], seq: {from: 512, to: 1024, step: 512}, hidden: {from: 1024, to: 2048, step: 512}, heads: {from: 8, to: 16, step: 8}, ffn_ratio: [4]}\n", "grid.configs = 4000000000", "at most"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\nsizes: 3\n", "sizes", "quick.yaml"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\npresets: {models: [], tp: [1], micro_batch: [1]}\n", "presets.models is empty"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\npresets: {models: [llama9], tp: [1], micro_batch: [1]}\n", "llama9"),
        plan!("name: p\ndtypes: [bf16]\nseed: 0\nprotocol: {warmup: 10, timed: 3, keep: 5}\n", "keep"),
        case("bench plan --plan {tmp}/missing.yaml", &[], &["missing.yaml"]),
        case("bench plan --timed 0", &[], &["timed"]),
        case("bench plan --gpus 0", &[], &["0 GPUs per node", "--gpus"]),
        case("bench plan --gpus 8 --nodes 5000", &[], &["5000 nodes", "--nodes"]),
        case("bench collect --device mock --gpus 0,1,1 --quick --out {tmp}/x", &[], &["GPU 1 twice"]),
        case("models check --cluster {repo}/hardware-profiles/dgx-h100.yaml --device mock --threshold nan", &[], &["--threshold", "nan"]),
        case("models check --cluster mi300x --device mock", &[], &["mi300x", "no models directory"]),
        case("models check --cluster {repo}/hardware-profiles/dgx-h100.yaml --device mock", &[], &["trained on NVIDIA H100", "this node has MOCK"]),
        case("models check --cluster {repo}/hardware-profiles/dgx-h100.yaml --device mock --previous {tmp}/gone", &[], &["gone", "meta.yaml"]),
        case("retrain --cluster {repo}/hardware-profiles/dgx-h100.yaml --device mock --out {tmp}/x --threshold 0", &[], &["--threshold", "above 0"]),
    ]
}

/// The synthetic dataset's meta.yaml, a collected one, and one with a bad GPU.
fn meta(kind: &str) -> String {
    match kind {
        "@meta" => common::META.to_string(),
        "@meta-collected" => format!("{}collector: stepcast-bench 0.1.0\n", common::META),
        "@meta-bad-gpu" => common::META.replace("memory_gib: 80.0", "memory_gib: -1"),
        _ => unreachable!(),
    }
}

fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let text = if let Some(edits) = content.strip_prefix("@dgx-h100:") {
            let (old, new) = edits.split_once("=>").unwrap();
            let base = std::fs::read_to_string(repo("hardware-profiles/dgx-h100.yaml")).unwrap();
            assert!(base.contains(old), "the cluster file has no line '{old}'");
            base.replacen(old, new, 1)
                .replace("../models/", &repo("models/"))
                .replace(
                    "dir: ../no-models-here",
                    &format!("dir: {}/no-models-here", dir.display()),
                )
        } else if content.starts_with("@meta") {
            meta(content)
        } else {
            content.replace("{repo}", env!("CARGO_MANIFEST_DIR"))
        };
        std::fs::write(&path, text).unwrap();
    }
}

/// Words a message's fix starts with.
const FIXES: &[&str] = &[
    "use ",
    "give ",
    "correct",
    "remove",
    "add ",
    "set ",
    "retrain",
    "check",
    "lower",
    "raise",
    "drop",
    "pick",
    "predict with",
    "create ",
    "train",
    "delete",
    "wait",
    "install",
    "rebuild",
    "rename",
    "choose",
    "fix",
    "must",
    "expected",
    "at least",
    "at most",
    "between",
    "instead",
    "describe",
    "should",
    "possible values",
    "tip:",
    "for more information",
    "write to another",
    "resume",
    "compare with",
    "see the readme",
];

struct Outcome {
    code: Option<i32>,
    stderr: String,
    stdout: String,
    seconds: f64,
}

fn run(args: &[String]) -> Outcome {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stepcast"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run stepcast");
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > LIMIT {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    Outcome {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[test]
fn every_bad_input_is_refused_with_what_to_change() {
    let all = cases();
    assert!(all.len() >= 150, "the catalogue holds {} cases", all.len());
    let scratch = tempfile::tempdir().unwrap();
    let dataset = scratch.path().join("shared-ds");
    write_dataset(&dataset);
    // the harness cases need stepcast-bench beside stepcast (a workspace `cargo test` builds it)
    let harness = Path::new(env!("CARGO_BIN_EXE_stepcast"))
        .with_file_name("stepcast-bench")
        .is_file();
    let mut failures = Vec::new();
    for (i, c) in all.iter().enumerate() {
        let runs_the_harness = ["bench ", "models check ", "retrain "]
            .iter()
            .any(|p| c.args.starts_with(p));
        if runs_the_harness && !harness {
            continue;
        }
        let dir = scratch.path().join(format!("case{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        write_files(&dir, c.files);
        let args: Vec<String> = c
            .args
            .split_whitespace()
            .map(|a| {
                a.replace("{tmp}", &dir.display().to_string())
                    .replace("{repo}", env!("CARGO_MANIFEST_DIR"))
            })
            .collect();
        let o = run(&args);
        let mut problems = Vec::new();
        if o.seconds > LIMIT.as_secs_f64() {
            problems.push(format!("took over {:?}", LIMIT));
        }
        if o.code != Some(2) {
            problems.push(format!("exit code {:?}", o.code));
        }
        if o.stderr.contains("panicked") || o.stderr.contains("RUST_BACKTRACE") {
            problems.push("panicked".into());
        }
        for n in c.needles {
            if !o.stderr.contains(n) {
                problems.push(format!("no '{n}'"));
            }
        }
        let lower = o.stderr.to_lowercase();
        if !FIXES.iter().any(|f| lower.contains(f)) {
            problems.push("no fix".into());
        }
        if std::env::var_os("STEPCAST_SHOW_MESSAGES").is_some() {
            eprintln!(
                "[{i}] stepcast {}\n    {}",
                c.args,
                o.stderr.trim().replace('\n', "\n    ")
            );
        }
        if !problems.is_empty() {
            failures.push(format!(
                "[{i}] stepcast {}: {}\n    stderr: {}\n    stdout: {}",
                c.args,
                problems.join(", "),
                o.stderr.trim(),
                o.stdout.lines().take(3).collect::<Vec<_>>().join(" | ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs were not refused well:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

/// A file pasted where a flag's value or an argument belongs is quoted by its start and length:
/// clap alone would print all of it back.
#[test]
fn a_pasted_value_is_quoted_by_its_start_and_length() {
    let pasted = "x".repeat(10_000);
    let shown = format!("{}… (10000 characters)", "x".repeat(60));
    for args in [
        vec!["predict".to_string(), "--schedule".into(), pasted.clone()],
        vec![
            "predict".to_string(),
            "--micro-batch".into(),
            pasted.clone(),
        ],
        vec!["predict".to_string(), pasted.clone()],
        vec![pasted.clone()],
    ] {
        let o = run(&args);
        assert_eq!(o.code, Some(2), "{}", o.stderr);
        assert!(o.stderr.contains(&shown), "{}", o.stderr);
        assert!(o.stderr.len() < 1_000, "{} bytes", o.stderr.len());
    }
    let o = run(&["predict".to_string(), format!("--{pasted}")]);
    assert_eq!(o.code, Some(2));
    assert!(o
        .stderr
        .contains(&format!("--{}… (10002 characters)", "x".repeat(58))));
    // a short bad value is still repeated whole, with the values clap accepts
    let o = run(&["predict".to_string(), "--schedule".into(), "zz".into()]);
    assert!(o.stderr.contains("invalid value 'zz'") && o.stderr.contains("possible values"));
}
