//! Command-line arguments, and the rewrite of model knob flags (`--depth 152`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// outcore: train beyond GPU memory by planning swaps, recomputation, order and layout.
#[derive(Debug, Parser)]
#[command(name = "outcore", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every model in the zoo with its knobs.
    Zoo {
        #[arg(long)]
        json: bool,
    },
    /// Summary statistics of a model or graph file.
    Stats {
        #[command(flatten)]
        graph: GraphArgs,
        #[arg(long)]
        json: bool,
    },
    /// Write a model or imported graph in outcore's own format (`outcore-graph/1`).
    Export {
        #[command(flatten)]
        graph: GraphArgs,
        /// Where to write the graph; `-` writes it to standard output.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// Plan a model under a memory budget and write the plan.
    Plan {
        #[command(flatten)]
        graph: GraphArgs,
        #[command(flatten)]
        target: TargetArgs,
        /// Planner name (`outcore compare --planners all` lists them all);
        /// `outcore`, the joint search seeded by every other planner, by default.
        #[arg(long, default_value = "outcore")]
        planner: String,
        /// Where to write the plan JSON.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// Simulate a plan file and report iteration time, memory and copies.
    Simulate {
        plan: PathBuf,
        /// Write a Chrome trace (opens in Perfetto).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Write the allocation trace (for `outcore alloc-replay`).
        #[arg(long = "alloc-trace")]
        alloc_trace: Option<PathBuf>,
        /// Measured per-op latencies that override the roofline model.
        #[arg(long = "latency-table")]
        latency_table: Option<PathBuf>,
        /// Iterations to simulate, 1 to 1000 (the report is the last one's).
        #[arg(long, default_value_t = 2, allow_hyphen_values = true, value_parser = iterations_value)]
        iterations: usize,
        #[arg(long)]
        json: bool,
    },
    /// Run several jobs on one device from a job list (`outcore-jobs/1`): each
    /// planned alone by its planner, then simulated together sharing memory,
    /// links and compute; prints per-job times and peaks, the global peak, and
    /// MSR / EOR / CBR against the same jobs unscheduled.
    Colocate {
        /// The job list (JSON).
        jobs: PathBuf,
        /// Device profile name (e.g. v100-16gb-pcie3) or a profile JSON file.
        #[arg(long)]
        device: String,
        /// Memory all jobs share: bytes or a size like 12GiB (default: the
        /// device's memory).
        #[arg(long, allow_hyphen_values = true)]
        budget: Option<String>,
        /// Write a Chrome trace of the run, a track group per job (opens in Perfetto).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Plan all jobs together with TENSILE's multi-job scheduler (each job's
        /// `priority` is its max swapping rate; its `planner` and `budget` are
        /// not used) and compare with each job planned alone by capuchin and by
        /// vdnn-conv at the bound TENSILE's plan for it proves. The trace is
        /// TENSILE's run.
        #[arg(long)]
        tensile: bool,
        /// Also train the jobs at once on the CPU executor, one shared arena,
        /// each planned for the CPU at its budget, with checks, and compare each
        /// with its model trained alone. (Not with `--tensile`: the CPU run
        /// plans each job alone.)
        #[arg(long, conflicts_with = "tensile")]
        run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Plan with several planners and compare their simulated results.
    Compare {
        #[command(flatten)]
        graph: GraphArgs,
        #[command(flatten)]
        target: TargetArgs,
        /// Comma-separated planner names, or `all`.
        #[arg(long, default_value = "all")]
        planners: String,
        #[arg(long)]
        json: bool,
    },
    /// Every planner on the benchmark suite (zoo CNNs and transformers and the
    /// repository's PyTorch exports, at 75/50/25/12.5% of the footprint on
    /// v100-16gb-pcie3 and h100-80gb), with the lower bound; the exports are
    /// read from the checkout in the current directory, else from the one
    /// outcore was built from. Prints a Markdown table (or JSON).
    BenchSuite {
        /// Comma-separated planner names, or `all`.
        #[arg(long, default_value = "all")]
        planners: String,
        /// Time limit of each search planner per case, seconds.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Plan again, with `--retry-seconds`, each case where a search
        /// planner's plan is more than this fraction above the lower bound
        /// (e.g. 0.1); the faster plan is kept, and its time is both searches'.
        #[arg(long, requires = "retry_seconds")]
        retry_gap: Option<f64>,
        /// The time limit of the second search (`--retry-gap`), seconds;
        /// more than `--seconds`.
        #[arg(long, requires = "retry_gap")]
        retry_seconds: Option<f64>,
        /// Retry `outcore`'s own searches bounded by this many scored moves
        /// per start instead of `--retry-seconds` (the same plan whatever the
        /// machine's speed; the other planners still retry on the clock).
        /// 20000 took 18 to 49 s per retried case of the suite on 2 cores
        /// (2026-12-04).
        #[arg(
            long,
            value_name = "N",
            requires = "retry_gap",
            allow_hyphen_values = true
        )]
        retry_moves: Option<i64>,
        /// Bound `outcore`'s own searches (`outcore`, `outcore-recompute`)
        /// by this many scored moves per start instead of `--seconds`: the
        /// same plans whatever the machine's speed (the other planners still
        /// end at `--seconds`). Not with `--retry-gap`, whose retry would
        /// plan the same again. 2000 took 496 s for resnet50's 16 cases (zoo
        /// and export) on 2 cores, where the suite's 5 s on the clock planned
        /// them in 65 s, with the same throughputs to three digits
        /// (2026-12-04).
        #[arg(
            long,
            value_name = "N",
            conflicts_with = "retry_gap",
            allow_hyphen_values = true
        )]
        moves: Option<i64>,
        /// Only these graphs (comma-separated labels' first words, e.g. `resnet50,gpt2`).
        #[arg(long)]
        only: Option<String>,
        /// The allocator every plan is made for and simulated under:
        /// perfect (bytes only), best-fit, best-fit-paged, size-class, virtual-chunks, or
        /// offsets (an exact layout per plan).
        #[arg(long, default_value = "perfect")]
        allocator: String,
        #[arg(long)]
        json: bool,
    },
    /// Plan (or load a plan) and execute it on a backend with real buffers.
    Run(RunArgs),
    /// Prove a plan file safe: rebuild its graph, run `verify()`, and exit
    /// non-zero with the first violations if it fails.
    Verify {
        plan: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Write one self-contained HTML report (inline SVG, no network): for a
    /// plan, device memory by tensor kind and the three streams with stalls;
    /// for `compare --json` output, throughput vs ideal with the lower bound.
    Report {
        /// A plan file (its graph is rebuilt from what the plan records, as
        /// `simulate` does).
        #[arg(long, conflicts_with = "compare", required_unless_present = "compare")]
        plan: Option<PathBuf>,
        /// Files written by `outcore compare --json` (repeat the flag, one
        /// per budget or model).
        #[arg(long)]
        compare: Vec<PathBuf>,
        /// Where to write the HTML report.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
        /// Also write each figure as a standalone SVG file in this directory.
        #[arg(long = "svg-dir")]
        svg_dir: Option<PathBuf>,
        /// Measured per-op latencies that override the roofline model (plans only).
        #[arg(long = "latency-table", requires = "plan")]
        latency_table: Option<PathBuf>,
    },
    /// The largest batch each planner can train under a fixed budget, and
    /// its simulated throughput there: doubling the zoo model's batch from 1,
    /// then bisection (feasibility is assumed monotone in the batch).
    MaxBatch(MaxBatchArgs),
    /// Replay an allocation trace through an allocator.
    AllocReplay {
        trace: PathBuf,
        /// `best-fit`, `best-fit-paged`, `size-class` or `virtual-chunks` (`perfect` places no
        /// addresses, so there is nothing to replay with it).
        #[arg(long)]
        allocator: String,
        /// Device capacity (default: unlimited, to measure what the trace needs).
        #[arg(long)]
        capacity: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `outcore run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Backend: `cpu` (the reference backend).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    #[command(flatten)]
    pub graph: GraphArgs,
    /// Run this plan file instead of planning (a plan made for the cpu
    /// backend; the plan's own budget and planner are used).
    #[arg(long, conflicts_with_all = ["model", "graph", "budget", "planner"])]
    pub plan: Option<PathBuf>,
    /// Budget: bytes, a size like 2GiB, or NN% of the footprint (the device arena's size).
    #[arg(long, required_unless_present = "plan", allow_hyphen_values = true)]
    pub budget: Option<String>,
    /// Planner name (`outcore compare --planners all` lists them all).
    #[arg(long, required_unless_present = "plan")]
    pub planner: Option<String>,
    /// Training iterations, 1 to 100000 (a run predicted to take over an hour is refused).
    #[arg(long, default_value_t = 10, allow_hyphen_values = true, value_parser = iters_value)]
    pub iters: u32,
    /// Device-arena allocator: perfect, best-fit, best-fit-paged, size-class, virtual-chunks,
    /// or offsets (the plan laid out at exact offsets, valid for every timing)
    /// (default: the plan's own, `perfect` for plans made here; a `perfect`
    /// plan then runs laid out at exact offsets where that fits its budget;
    /// where it does not, a plan made here is made again for `offsets`, and
    /// one the planner cannot make so, a loaded one, or one for a named
    /// `perfect` runs on a best-fit list).
    /// Also used by the simulator's prediction.
    #[arg(long)]
    pub allocator: Option<String>,
    /// Physical chunk size of `--allocator virtual-chunks`, KiB (default 2048;
    /// tiny models need small chunks such as 64); requests up to a quarter
    /// chunk share chunks.
    #[arg(long = "chunk-kib", allow_hyphen_values = true, value_parser = chunk_kib_value)]
    pub chunk_kib: Option<u64>,
    /// Throttle host<->device copies to this rate (GB/s) so overlap and stalls show.
    #[arg(long = "link-gbps")]
    pub link_gbps: Option<f64>,
    /// Checksum tensors at swap-out / swap-in and compare recomputed tensors.
    #[arg(long)]
    pub check: bool,
    /// Also run without swapping or recomputation and compare final parameters bit for bit.
    #[arg(long)]
    pub reference: bool,
    /// Write a Chrome trace of what ran.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the measured-latency table (loadable with --latency-table).
    #[arg(long = "profile-out")]
    pub profile_out: Option<PathBuf>,
    /// Run every op on a synthetic kernel that takes the cost model's time (for
    /// graphs too large for the CPU's reference kernels).
    #[arg(long)]
    pub synthetic: bool,
    /// Speed at which stand-in kernels (ops without a CPU kernel) run, FLOP/s.
    #[arg(long = "synthetic-flops", default_value_t = 1e10)]
    pub synthetic_flops_per_s: f64,
    /// Seed of the planner's randomness: the same seed gives the same plan,
    /// except where a search planner's 10 s limit ends its search (then how
    /// far it got depends on the machine's speed); with `--moves`,
    /// `outcore`'s plan is the same whatever the machine's speed.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = seed_value)]
    pub seed: u64,
    /// End `outcore`'s own search (`--planner outcore` or
    /// `outcore-recompute`) after N scored moves per start instead of at its
    /// 10 s limit, as `outcore plan --moves`.
    // Negative text reaches the facade's check, which names the accepted range.
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        conflicts_with = "plan"
    )]
    pub moves: Option<i64>,
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `outcore max-batch`.
#[derive(Debug, Args, Clone)]
pub struct MaxBatchArgs {
    /// Zoo model name (see `outcore zoo`); its batch is what is searched.
    #[arg(long)]
    pub model: String,
    /// Model knob as NAME=VALUE (also written `--NAME VALUE`, e.g. `--depth 152`).
    #[arg(long = "knob", value_name = "NAME=VALUE")]
    pub knobs: Vec<String>,
    /// Optimizer: sgd, adam, adamw or none (default: the model's).
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Device profile name (e.g. rtx2080ti-11gb) or a profile JSON file.
    #[arg(long)]
    pub device: String,
    /// Budget: bytes or a size like 11GB / 10GiB (default: the device's
    /// memory); not a percentage, since the footprint grows with the batch.
    #[arg(long, allow_hyphen_values = true)]
    pub budget: Option<String>,
    /// Comma-separated planner names, or `all`.
    #[arg(long, default_value = "none,capuchin,home")]
    pub planners: String,
    /// Allocator the plans run under: perfect, best-fit, best-fit-paged, size-class, virtual-chunks, or
    /// offsets (each plan made in bytes, then laid out at exact offsets; replanned at a
    /// lower budget while the layout needs more than the budget).
    #[arg(long, default_value = "perfect")]
    pub allocator: String,
    /// The largest batch tried, 1 to 16777216.
    #[arg(long, default_value_t = 65536, allow_hyphen_values = true, value_parser = limit_value)]
    pub limit: u64,
    /// Seed of the planners' randomness: the same seed gives the same plan,
    /// except where `--seconds` ends a search (then how far it got depends on
    /// the machine's speed).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = seed_value)]
    pub seed: u64,
    /// Wall-clock seconds for a search-based planner at each batch tried.
    #[arg(long, default_value_t = 10.0, allow_hyphen_values = true)]
    pub seconds: f64,
    #[arg(long)]
    pub json: bool,
}

/// Which graph: a zoo model or a graph file.
#[derive(Debug, Args, Clone)]
pub struct GraphArgs {
    /// Zoo model name (see `outcore zoo`).
    #[arg(long, conflicts_with = "graph")]
    pub model: Option<String>,
    /// Batch size for a zoo model (default: the model's).
    // Hyphen values reach the number parser, which names `-1` as not a whole
    // number, instead of clap calling it an unexpected argument.
    #[arg(long, requires = "model", allow_hyphen_values = true)]
    pub batch: Option<u64>,
    /// A graph file (`dnn-train-graph/1` or `outcore-graph/1`).
    #[arg(long)]
    pub graph: Option<PathBuf>,
    /// Model knob as NAME=VALUE (also written `--NAME VALUE`, e.g. `--depth 152`).
    #[arg(long = "knob", value_name = "NAME=VALUE", requires = "model")]
    pub knobs: Vec<String>,
    /// Optimizer for a zoo model: sgd, adam, adamw or none (default: the model's).
    #[arg(long, requires = "model")]
    pub optimizer: Option<String>,
}

/// Device, budget and search settings shared by `plan` and `compare`.
#[derive(Debug, Args, Clone)]
pub struct TargetArgs {
    /// Device profile name (e.g. v100-16gb-pcie3), a profile JSON file, or
    /// `cpu-reference` (the CPU backend of `outcore run`: a plan for it runs with
    /// `outcore run --plan`).
    #[arg(long)]
    pub device: String,
    /// Budget: bytes, a size like 12GiB / 512MiB, or NN% of the footprint.
    // Negative text reaches the budget parser, which names the accepted range.
    #[arg(long, allow_hyphen_values = true)]
    pub budget: String,
    /// Allocator the plan uses: perfect, best-fit, best-fit-paged, size-class, virtual-chunks, or
    /// offsets (the plan made in bytes, then laid out at exact offsets; replanned at a
    /// lower budget while the layout needs more than the budget).
    #[arg(long, default_value = "perfect")]
    pub allocator: String,
    /// Seed of the planners' randomness: the same seed gives the same plan,
    /// except where `--seconds` ends a search (then how far it got depends on
    /// the machine's speed); with `--moves`, `outcore`'s plan is the same
    /// whatever the machine's speed.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = seed_value)]
    pub seed: u64,
    /// Wall-clock seconds for search-based planners.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// End `outcore`'s own search (`outcore`, `outcore-recompute`) after N
    /// scored moves per start instead of at `--seconds`, so that the same
    /// seed gives the same plan whatever the machine's speed and thread
    /// count, however long it takes there (20000: 25 to 56 s for the GPT-2
    /// example at 25% on 2 cores, 2026-12-03 and 04). Other planners still
    /// end at `--seconds`.
    // Negative text reaches the facade's check, which names the accepted range.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub moves: Option<i64>,
    /// Measured per-op latencies (`outcore run --profile-out`) that override the
    /// roofline model for the ops they list.
    #[arg(long = "latency-table")]
    pub latency_table: Option<PathBuf>,
}

/// Rewrites `--NAME VALUE` and `--NAME=VALUE` for every zoo knob name into
/// `--knob NAME=VALUE`, so that each model's knobs read as ordinary flags.
pub fn rewrite_knob_flags(argv: Vec<String>) -> Vec<String> {
    let mut knob_names: Vec<&'static str> = outcore_graph::zoo::models()
        .iter()
        .flat_map(|m| m.knobs.iter().map(|k| k.name))
        .collect();
    knob_names.sort_unstable();
    knob_names.dedup();
    let mut out = Vec::with_capacity(argv.len());
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        let flag = arg.strip_prefix("--").unwrap_or("");
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        if !flag.is_empty() && knob_names.contains(&name) {
            let value = match inline {
                Some(v) => Some(v),
                None => {
                    i += 1;
                    argv.get(i).cloned()
                }
            };
            out.push("--knob".to_string());
            out.push(format!("{name}={}", value.unwrap_or_default()));
        } else {
            out.push(arg.clone());
        }
        i += 1;
    }
    out
}

/// `text` as a whole number, or an error naming what is accepted (clap's own
/// "invalid digit found in string" names neither the value's problem nor
/// the range, and a negative number never reached a range check).
fn whole_number(text: &str, accepted: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| format!("`{text}` is not a whole number in the accepted range: {accepted}"))
}

/// `--seed`.
fn seed_value(text: &str) -> Result<u64, String> {
    whole_number(text, "0 to 18446744073709551615, e.g. 0")
}

/// `max-batch --limit` (its range is checked again with the zoo's limit).
fn limit_value(text: &str) -> Result<u64, String> {
    whole_number(text, "1 to 16777216, e.g. 65536")
}

/// `run --chunk-kib` (checked again when the allocator is built).
fn chunk_kib_value(text: &str) -> Result<u64, String> {
    whole_number(text, "a whole number of KiB in [2, 2^54], e.g. 2048")
}

/// `simulate --iterations`.
fn iterations_value(text: &str) -> Result<usize, String> {
    const ACCEPTED: &str = "1 to 1000, e.g. 2";
    let n = whole_number(text, ACCEPTED)?;
    usize::try_from(n).map_err(|_| format!("`{text}` is out of range: {ACCEPTED}"))
}

/// `run --iters`.
fn iters_value(text: &str) -> Result<u32, String> {
    const ACCEPTED: &str = "1 to 100000, e.g. 10";
    let n = whole_number(text, ACCEPTED)?;
    u32::try_from(n).map_err(|_| format!("`{text}` is out of range: {ACCEPTED}"))
}
