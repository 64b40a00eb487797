//! `outcore`: outcore's own planner. It runs every other planner in
//! [`crate::all`] as a seed (a portfolio), then improves the fastest seeds'
//! schedules by local search over keep / swap / recompute and swap timing
//! ([`moves`], [`local`]), all scored by the one evaluator.
//!
//! Choices, and why:
//! - **Seeds from every planner.** Each seed is the best answer to one slice
//!   of the problem (recomputation for `checkpoint-*`, swap timing for
//!   `window` and `lms`, order and pool for `swapadvisor`, a global keep /
//!   swap / recompute choice per feature map for `home`); starting from all
//!   of them makes `outcore` at least as fast as each of them on the same
//!   request by construction, and feasible wherever any of them is.
//! - **Two orders for the seeds.** When the request plans in the graph's
//!   order, the fast rule-based seeds ([`EAGER_ORDER_SEEDS`]) also plan in
//!   the eager-update order ([`outcore_plan::eager_update_order`]: each
//!   optimizer op as soon as its gradient is complete, which frees the
//!   gradient at once and lets the optimizer state move while the backward
//!   pass runs). Neither order wins everywhere (`order_study` example, in
//!   RESULTS.md: ResNet-50 b64 at 25% gains 3 points in the eager order,
//!   the PyTorch GPT-2 export at 50% lost 6 before the eager order stopped
//!   hoisting gradient-free optimizer ops to the iteration's start), so both compete as seeds and
//!   the local search starts from the fastest whatever its order. This is the
//!   joint planner's search over the order: a choice between two orders, not
//!   a search of the space of orders (SwapAdvisor's seed searches that).
//! - **Local search over gaps, on the seed's own order.** A seed's schedule
//!   ([`outcore_plan::Plan::lowered_from`]) is a list of gaps; the moves edit
//!   one or two gaps at a time. Editing the order as well (SwapAdvisor's
//!   crossover) is left to the `swapadvisor` seed: a move of the order shifts
//!   every gap's positions, and re-deriving them is a seed's job.
//! - **Recomputations turned into swaps first.** Within each round the
//!   moves that end the dearest recomputations are scored first
//!   ([`local`]'s `prioritise`), and a recomputation turned into a swap has
//!   its copies placed where the link is idle between the other swaps'
//!   (`moves::placed_swap`). Together they moved 23 suite cases up and 2
//!   down (RESULTS.md, issue-16 section, "Swaps placed on the idle link").
//! - **Repair starts.** Besides the [`IMPROVED_SEEDS`] fastest seeds, the
//!   search starts from schedules over the budget — every tensor kept, the
//!   lower bound's cut program at the end of the forward pass rounded to a
//!   schedule ([`program`]), and the recomputation planners' plans for 1.5x
//!   the budget — and repairs them with moves that take tensors off the
//!   device (a swap hidden behind compute, or a recomputation), then
//!   improves them as the others. Where every seed is swap-bound (ResNet-50
//!   b256 at 25%: no recomputation plan fits), this is where mixed plans
//!   come from; where the program finds a cheaper mix than every rule (the
//!   PyTorch MobileNet v2 export at 50%: 0.854 of ideal before, 0.907 from
//!   the program's start), so does the program's start. A repair too slow
//!   to reach the budget in its share is given up
//!   (`local::RepairPace`), its time left to the starts after it: far below
//!   the footprint (12.5%) these starts ended over the budget with their
//!   whole share spent.
//! - **Time split.** 70% of the first 5 s of the time limit goes to the
//!   seeds, and 20% of the rest (at `--seconds 60`, 14.5 s): the rule-based
//!   ones first, then the searches ([`SEARCH_SEEDS`]); each seed gets its
//!   weight's share of what is left when it starts (weight 3 for `home`, 1
//!   for the others), so the rule-based seeds (milliseconds each) hand almost
//!   all of theirs on, and `home` gets three quarters of what the searches
//!   share. The rest goes to the local search (two phases, below): first a
//!   share of what is left to each start in turn (a double one to the
//!   fastest seed's and to the bound's program's, `PROGRAM_SHARE`).
//!   Measured on the
//!   13 suite cases where `home` alone (5 s) beat `outcore` by more than 0.5%
//!   (RESULTS.md, "HOME restarts inside `outcore`"): with half the time for
//!   the seeds and equal shares, 3 of them stayed behind; with this split
//!   none did, while the seven local-search-bound cases measured beside
//!   them (25% and 12.5%, where the local search makes most of `outcore`'s
//!   gain) moved by at most 0.003 of ideal. `swapadvisor`'s quarter is the
//!   price: it is the best planner on none of the suite's cases. Beyond 5 s
//!   the searches among the seeds have mostly converged while the local
//!   search is still gaining at 25% of the footprint: at `--seconds 60`,
//!   with 70% of all of it for the seeds, GPT-2 b8 at 25% on `h100-80gb`
//!   reached 0.758 of ideal and DenseNet-121 at 25% on `v100-16gb-pcie3`
//!   0.748; with this split 0.780 and 0.757 (RESULTS.md, "A 60 s search on
//!   the cases that miss"). Where the budget is below the floor of `home`'s
//!   policy space ([`crate::home::below_floor`]: the parameters, gradients
//!   and optimizer state it never moves leave no room), `home` does not run
//!   and its three quarters go to the local search, not to `swapadvisor`
//!   (RESULTS.md, "HOME's floor"): BERT-base at 12.5% rose 0.011 of ideal on
//!   `v100-16gb-pcie3`, the PyTorch GPT-2 export at 25% 0.008; GPT-2 b8 at
//!   25% on `h100-80gb` fell 0.005 (the longer search ended in another
//!   local optimum). Above the floor, `home`'s first swarm may take half
//!   of its share (`HOME_FIRST_SHARE`); where no swarm finds a plan, the
//!   rest goes to the local search too (DenseNet-121 at 12.5% on
//!   `h100-80gb`: the one swarm of 32 particles had run 1.73 s and found
//!   no plan; `outcore` 0.0908 to 0.0898 s). The seeds that keep and swap
//!   only ([`SWAP_ONLY_SEEDS`]: the `vdnn` family, `lms`, `window`,
//!   `odswap`, `swapadvisor`) do not run where their plans could not be
//!   starts: where the swap-only lower bound
//!   (`outcore_bound::swap_only_bound`: no plan without recomputation is
//!   faster) is slower than the [`IMPROVED_SEEDS`]-th fastest seed family
//!   so far (`Joint::swap_only_skip`). So that those families are known,
//!   the rule-based ones among them run after the streamed and mixed seeds
//!   ([`Job::SwapOnly`], with no weight in the shares of the seeds before
//!   them); `swapadvisor`'s share then goes to the local search. `tensile`
//!   ([`LATE_SEEDS`]) runs after the streamed and mixed seeds too, with its
//!   weight: its greedy may take half a second and find no plan.
//! - **Streamed seeds** ([`streamed`]): the parameters and optimizer state
//!   kept on the host and streamed around their uses, the activations
//!   recomputed by a recomputation planner planned for the memory that
//!   frees. Where the persistent tensors alone come near the budget, every
//!   other seed swaps activations over the link; these are the only seeds
//!   that recompute there (BERT-base and GPT-2 b8 at 25%: 0.27-0.43 of ideal
//!   before, 0.74-0.75 with them; RESULTS.md).
//! - **Offloaded-activation seeds** ([`offloaded`]): the feature maps
//!   dearest to recompute per byte swapped across the turn of the pass, as
//!   many as the link can carry in the forward and backward passes' compute
//!   time, and DTR planned for the memory that frees. Neither the swap
//!   seeds (which wait on the link) nor the recomputation seeds (which leave
//!   it idle) give such a mix, and the local search turns recomputations
//!   into swaps one accepted move at a time.
//! - **Mixed seeds** ([`mixed`]): the streamed seeds' offloads, the
//!   activations dearest to recompute swapped in what the link leaves beside
//!   them, DTR for the rest, and every swap-in timed as one queue on the
//!   h2d link. Where the persistent tensors alone are over the budget
//!   neither the offloaded seeds (no plan) nor the streamed ones (which
//!   recompute every activation) give that mix: on `bench-suite --planners
//!   outcore --only bert-base,gpt2,densenet121 --seconds 5` BERT-base at
//!   12.5% on `h100-80gb` went from 0.679 to 0.735 of ideal and GPT-2 b8 at
//!   25% on `v100-16gb-pcie3` from 0.805 to 0.853 (RESULTS.md, issue-16
//!   section, "Mixed seeds").
//! - **Kept-link seeds** ([`kept`]): DTR keeping the dead storages it
//!   rematerialises for recomputations, evictable by its score, instead of
//!   evicting them at once, in both orders. Where many recomputations read
//!   the same dead storages (a dense block's features, read again by every
//!   concatenation the backward pass recomputes) eager eviction starts each
//!   over: on DenseNet-121 b64 at 12.5% on `v100-16gb-pcie3` the plan went
//!   from 0.498 to 0.642 of ideal at 5 s (RESULTS.md, "Kept chain links").
//! - **Two phases of local search.** Half of the local search's time is
//!   shared by the starts as above; the rest continues the fastest schedule
//!   reached by a search the time limit cut short. With a third improved
//!   seed ([`IMPROVED_SEEDS`]) this keeps a start from being lost when a new
//!   seed type (the streamed seeds) takes a place among the fastest: on
//!   BERT-base at 50% on `h100-80gb`, with two improved seeds and one phase
//!   the streamed seed displaced `dtr`'s and the plan fell from 0.916 to
//!   0.894 of ideal; with three and two phases it is 0.916.
//! - **Swap timing polished in turns with the second phase** ([`turns`],
//!   [`local::polish`]): when the schedule makes compute wait for
//!   swap-ins, a climb over the triggers of those swap-ins (and the two
//!   run before each on the h2d stream) alone, densely
//!   ([`moves::Kinds::SwapTiming`]), after starting them all earlier at
//!   once while that improves ([`moves::led_swap_ins`]). On the PyTorch
//!   VGG-16 b32 export at 50% on `v100-16gb-pcie3` the search ended 1.1 ms
//!   stalled on a momentum buffer's swap-in from the iteration's start,
//!   which the main neighbourhood does not retime; the polish starts it
//!   earlier, and the plan goes from 0.8999 to 0.903 of ideal (RESULTS.md,
//!   issue-16 section, "Swap-ins' triggers polished"). The polish and the
//!   continued search take turns on one schedule: the search until a
//!   reserve point that follows the stalls (a tenth to a half of the time
//!   left) or until it stagnates, then the polish until it converges, then
//!   the search again from the polished schedule. Before, the polish ran
//!   once, at the end, in that share: cut short where it gained most, its
//!   rest lost where it converged early, and its schedule never searched
//!   again by the main moves (the PyTorch GPT-2 export at 25% on
//!   `v100-16gb-pcie3` at 60 s: 0.2159 s before, 0.2089 s with turns;
//!   RESULTS.md, issue-16 section, "The second phase in turns").
//! - **Kept to its update** ([`to_update`]): once the polish has converged
//!   on a schedule that still stalls, one polish run from it with the swap
//!   gap of its largest parameter inside the backward pass dropped (the
//!   tensor kept from its last backward read to its update, one h2d copy
//!   fewer) and the swap-ins prefetched across the new peak started later,
//!   the furthest use first, until it fits. No single move does both (the
//!   gap dropped alone is 65-137 MiB over the budget on the PyTorch GPT-2
//!   export at 25%, and the repair moves did not bring it back). There,
//!   with the tied token embedding kept, `bench-suite`'s 54 s retry went
//!   from 0.548 to 0.578 of ideal on `v100-16gb-pcie3` (gap to the bound
//!   0.301 to 0.232) and 0.738 to 0.747 on `h100-80gb`. RESULTS.md,
//!   issue-16 section, "A large parameter kept to its update".
//! - **Room at the largest working set** ([`room`]): at the polish's next
//!   convergence after the kept run, on a schedule that still stalls, one
//!   more polish run from it with the saved activations resident across its largest working set
//!   recomputed (cheapest per byte first, each kept where the schedule
//!   still verifies and fits). The op with the largest working set leaves
//!   the least room for swap-ins, and no single recomputation frees enough
//!   to start one, so the search never takes them one by one. On the
//!   PyTorch GPT-2 export at 25% on `h100-80gb`, four paired 54 s runs:
//!   0.0469-0.0476 s with it against 0.0479-0.0489 s without; on
//!   `v100-16gb-pcie3` 0.2039 s against 0.2035 s in every run (the
//!   search after it takes another path). RESULTS.md, issue-16 section,
//!   "Room at the largest working set".
//! - **Held exchanges** ([`held`]): the two fastest seeds' schedules
//!   (`HELD_STARTS`) with their chained recomputations traded for cheaper
//!   ones whose dead inputs the lowering holds are two more starts (one,
//!   from the fastest, until the mixed seeds made a faster seed than the
//!   offloaded one on DenseNet-121 at 25% on `v100-16gb-pcie3`, whose plan
//!   came from the offloaded seed's trade: 0.852 of ideal with it, 0.777
//!   without). In DenseNet-121 the seeds recompute
//!   the batch norm and ReLU after each concatenation (two ops per byte
//!   freed) where recomputing the concatenation from the held features is
//!   one; the first such trade in a block is over the budget alone, so no
//!   single move reaches it. And every move that gives up a recomputation
//!   drops the chain links left with no reader (they were recomputed for
//!   nothing). Together, on the suite against the build before in the same
//!   session: DenseNet-121 at 50% from 0.894 / 0.892 to 0.901 / 0.899
//!   (`h100-80gb` / `v100-16gb-pcie3`), 18 cases up and none down by more
//!   than 0.003 (RESULTS.md, issue-16 section, "Held inputs").
//! - **Optimizer states copied out early** ([`early_out`]): an offloaded
//!   optimizer state is copied in before its update and out after it, both
//!   in the backward pass, and the last updates' copy-outs run after the
//!   last op, the iteration waiting for them. Turned around, a state stays
//!   on the device from its update to the iteration's end and is copied out
//!   early in the next one, where the forward pass leaves the link idle.
//!   The fastest seeds (within [`EARLY_OUT_WITHIN`] of the fastest) that
//!   offload states get one more seed each, with as many of the latest
//!   updated turned around as a sweep over counts finds fastest (more hold
//!   more memory at the iteration's turn), and the fastest schedule the
//!   local search reaches is swept again (`Joint::early_out_reached`).
//!   On the PyTorch GPT-2 export at
//!   50% on `v100-16gb-pcie3` the seed `streamed optimizer state + dtr`
//!   went from 0.148 s to 0.124 s with its two latest-updated states (the
//!   tied embedding's Adam moments, 154 MB each) turned around; on the
//!   suite, against the build before in the same session, 11 cases rose by
//!   more than 0.003 of ideal (that export at 50% from 0.896 / 0.880 to
//!   0.908 / 0.917 on `v100-16gb-pcie3` / `h100-80gb`, BERT-base at 25% by
//!   0.026, GPT-2 b8 at 25% by 0.024 / 0.034) and one fell, by the noise of
//!   ViT-B/16 at 12.5% (RESULTS.md, issue-16 section, "Optimizer states
//!   copied out early"). The first version (the three fastest seeds
//!   whatever their times, every power of two, the variants a family of
//!   their own) spent a second of a 5 s limit on BERT-base at 12.5% and
//!   moved 8 cases up and 10 down.
//! - **Parameters kept across the turn, copies out early**
//!   ([`early_out::kept_across`], [`early_out::copied_out_early`]): the
//!   same sweep then tries keeping each large offloaded parameter
//!   (at least [`KEPT_ACROSS_SHARE`] of the budget, [`KEPT_ACROSS_TRIES`]
//!   of them) on the device from its update across the iteration's turn to
//!   its first use, where it also leaves the device in between: that gap
//!   copies it out early, on the d2h link's idle time
//!   ([`outcore_plan::Gap::copy_out_after`]), instead of the offload's copy
//!   in at the start and out at the end. Then every swap's copy-out is
//!   started early where the link model has room. Each is kept where the
//!   score says it is faster. Before the states' sweep and after it, since
//!   both hold memory at the turn. Measured when built on the PyTorch GPT-2
//!   export at a quarter of its footprint on `v100-16gb-pcie3` (`outcore
//!   plan ... --seconds 5`): its token embedding (147 MiB), kept across
//!   with 1 state turned around, made a seed of 0.3189 s against 0.3278 s
//!   (32 states, nothing kept) and the plan 0.2975 s against 0.3127 s.
//!   The smaller parameters are then tried all at once, shortest turn
//!   first, by count ([`early_out::shortest_turn_first`]): one at a time
//!   each would be an evaluation for a copy of a millisecond or less. They
//!   are kept only where the seed gains [`KEPT_BATCH_MIN_GAIN`]: what they
//!   hold at the turn the search from the seed can no longer spend.
//! - **Reclaim points re-timed behind the d2h queue**
//!   ([`requeue::fastest_requeued`]): each variant above is finished by
//!   moving its swaps' reclaim points later, to where the in-order d2h
//!   stream finishes the copies queued before them (each was timed by its
//!   own copy alone), as far as a swept limit lets them (the whole queue
//!   holds too much memory). On that GPT-2 case the plan went from 0.2952 s
//!   to 0.2453 s; on the suite 9 cases up, none down (RESULTS.md, issue-16
//!   section, "Reclaim points re-timed behind the d2h queue").
//! - **HOME restarted** with a doubling swarm, 32 particles first
//!   (`Joint::home_restarts`): `home` alone runs one swarm of 512.
//! - **The layout.** Asked for `offsets` (an exact offset per allocation),
//!   the plan is made in bytes and laid out afterwards
//!   ([`crate::layout::plan_laid_out`], for every planner alike), replanned
//!   at a lower budget while the layout needs more than the budget. Under the
//!   other allocators every candidate is scored under the request's
//!   allocator, so a plan never fits in bytes but not in the allocator.
//!   Choosing among allocators is left to the caller (`--allocator`).
//! - **A recompute-only variant**, `outcore-recompute` ([`Joint::recompute_only`]):
//!   the same search restricted to recomputation, seeded by the
//!   recompute-only planners (`dtr` and `checkpoint-*`) and moving only by
//!   keeping, exchanging and adding recomputations ([`moves::Kinds`]). It is
//!   what checkpointing with a search behind it reaches, measured against
//!   the exact reference (`checkmate-milp`) on small graphs. Being seeded by
//!   `dtr`, it is never slower than `dtr` by construction; what it adds is
//!   measured in RESULTS.md.
//! - A seed planner's error (a bug of that planner) does not stop `outcore`:
//!   it is recorded in the plan's settings (`seed_errors`) and the seed is
//!   skipped. The conformance suite tests every seed on its own.
//! - **Bounded by counts, or by the clock.** By default the request's time
//!   limit ends every part of the search (each part's share of it, above),
//!   so where the search stops, and so the plan, depends on the machine's
//!   speed and load. [`Joint::bounded_by_moves`] ends it by counts alone:
//!   `max_moves` scored moves per start and per phase (checked after each
//!   parallel batch of [`local::BATCH`], so a phase may end up to 31 past
//!   it), [`COUNTED_GENERATIONS`] of SwapAdvisor's seed, HOME's swarms at
//!   their convergence or patience, every rule-based seed (the recomputation
//!   plans of the merges and the relaxed repair starts included) at its end.
//!   The request's time limit is then not read: the search runs as if it had
//!   [`COUNTED_TIME_LIMIT_S`], so that no share of it ends a part and no
//!   repair is paced off the clock (`local::RepairPace`), and the same seed
//!   gives the same plan whatever the machine's speed and rayon's thread
//!   count (tests: `tests/joint.rs`, `bounded_by_moves_*`), however long the
//!   run takes there. Why a move count and not a
//!   clock that counts work: every part of the search (the seeds' shares,
//!   the repair pace, the turns' reserve, parallel batches checking a
//!   deadline per candidate) keys off the time left, and counting work
//!   deterministically across rayon's threads would change each of them;
//!   bounded by counts they all run to their own ends, which the library's
//!   tests already relied on (`tests/joint.rs`). Measured on the GPT-2
//!   export at 25% on `h100-80gb` (RESULTS.md, issue-16 section, "Bounded
//!   by moves: the same plan however fast the machine"): 3,000 moves per start
//!   0.049047 s in 11 s, 10,000 moves 0.047654 s in 25 s, 20,000 moves
//!   0.047002 s in 44-56 s, 30,000 moves 0.047091 s in 54-65 s, each the
//!   same plan in two runs or more. A move scores the whole schedule, so a
//!   count's wall time grows with the graph (DenseNet-121 b64 at 12.5%:
//!   20,000 moves took 76.7 s on `v100-16gb-pcie3`, 85.1 s on `h100-80gb`).

pub mod early_out;
pub mod held;
pub mod kept;
pub mod local;
pub mod mixed;
pub mod moves;
pub mod offloaded;
pub mod program;
pub mod requeue;
pub mod room;
pub mod streamed;
pub mod to_update;
pub mod turns;

use crate::framework::{Ctx, Score, Scored, Scratch, Search};
use local::Cost;
use outcore_graph::OpId;
use outcore_plan::{
    Infeasible, InfeasibleKind, Plan, PlanOutcome, PlanRequest, Planner, PlannerError,
    PlannerErrorKind, Schedule, check_order,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The planner's name on the command line.
pub const NAME: &str = "outcore";
/// The recompute-only variant's name.
pub const RECOMPUTE_NAME: &str = "outcore-recompute";
/// Seeds whose schedules the local search improves, fastest first.
pub const IMPROVED_SEEDS: usize = 3;
/// Points of each start's search curve kept in the plan's settings (drawn by
/// `outcore report`).
const CURVE_POINTS: usize = 100;
/// Share of the time limit the seeds get (module docs, "Time split"), of
/// its first [`SEED_SHARE_UPTO_S`] seconds.
const SEED_SHARE: f64 = 0.7;
/// Seconds of a time limit of which the seeds get [`SEED_SHARE`].
const SEED_SHARE_UPTO_S: f64 = 5.0;
/// Share of the time limit beyond [`SEED_SHARE_UPTO_S`] the seeds get.
const SEED_SHARE_BEYOND: f64 = 0.2;

/// The seeds' time out of a time limit `total` (module docs, "Time split").
fn seeds_time(total: Duration) -> Duration {
    let first = total.min(Duration::from_secs_f64(SEED_SHARE_UPTO_S));
    first.mul_f64(SEED_SHARE) + (total - first).mul_f64(SEED_SHARE_BEYOND)
}
/// A seed's weight in the split of the seeds' time: 1 for a rule-based seed
/// (which hands what it does not use to the next), [`HOME_WEIGHT`] for
/// `home`, 1 for `swapadvisor` (module docs, "Time split").
fn seed_weight(planner: &str) -> f64 {
    if planner == "home" { HOME_WEIGHT } else { 1.0 }
}
/// `home`'s weight in the split of the seeds' time.
const HOME_WEIGHT: f64 = 3.0;
/// The streamed seeds' weight (per order) in the split of the seeds' time.
/// They end when every merge is made, and what they leave goes to the
/// searches after them. With weight 1 at `--seconds 5` on BERT-base b32 at
/// 25% on `h100-80gb` the share was 0.375 s and a full run takes 0.5-0.7 s,
/// so the last sets' merges (the link-hidden ones) were cut or made
/// depending on the machine's speed at the time: 0.709 to 0.792 of ideal.
const STREAMED_WEIGHT: f64 = 3.0;

/// outcore's joint planner (module docs).
#[derive(Debug, Clone)]
pub struct Joint {
    /// Seeds whose schedules the local search improves, fastest first.
    pub improved_seeds: usize,
    /// Also start from schedules over the budget, repaired (module docs).
    pub repair_starts: bool,
    /// Kicks per start after its first local optimum.
    pub max_kicks: usize,
    /// Moves scored per start, at most (besides the time limit).
    pub max_moves: usize,
    /// The SwapAdvisor seed's settings (its search runs until its share of
    /// the time limit unless bounded here).
    pub swapadvisor: crate::SwapAdvisor,
    /// The HOME seed's settings, its first run's swarm size among them (each
    /// swarm stops at convergence, at its patience or at the end of HOME's
    /// share of the time limit).
    pub home: crate::Home,
    /// Recomputation only: recompute-only seeds and moves (module docs).
    pub recompute_only: bool,
    /// Also run [`EAGER_ORDER_SEEDS`] in the eager-update order (module docs).
    pub eager_seeds: bool,
    /// Runs of HOME at most, each with twice the swarm of the one before, as
    /// long as its share of the time lasts (`Joint::home_restarts`); 1 runs
    /// `home` once with `home`'s settings.
    pub home_runs: usize,
    /// Also seed with persistent tensors streamed and activations recomputed
    /// ([`streamed`]); not in the recompute-only variant.
    pub streamed_seeds: bool,
    /// Also seed with the activations dearest to recompute swapped across
    /// the turn of the pass and the rest left to DTR ([`offloaded`]); not in
    /// the recompute-only variant.
    pub offloaded_seeds: bool,
    /// Also seed with the persistent tensors streamed and the activations
    /// dearest to recompute swapped beside them ([`mixed`]); not in the
    /// recompute-only variant.
    pub mixed_seeds: bool,
    /// Also seed with DTR keeping the chain links it rematerialises
    /// ([`kept`]).
    pub kept_link_seeds: bool,
    /// The local search scores first the moves that end the dearest
    /// recomputations ([`local::Limits::prioritised`]).
    pub prioritised: bool,
    /// When the schedule makes compute wait for swap-ins, those swap-ins'
    /// triggers are searched in turns with the main search ([`turns`]);
    /// not in the recompute-only variant, which has no swap.
    pub polish_swap_timing: bool,
    /// Also start from the fastest seed's schedule with its chained
    /// recomputations traded for held ones ([`held`]).
    pub held_starts: bool,
    /// Also seed with the fastest seeds' offloaded optimizer states copied
    /// out early in the next iteration ([`early_out`]).
    pub early_out_seeds: bool,
    /// Ended by counts alone, the request's time limit not read (module
    /// docs, "Bounded by counts"); set by [`Joint::bounded_by_moves`].
    pub bounded_by_counts: bool,
}

impl Default for Joint {
    fn default() -> Self {
        Joint {
            improved_seeds: IMPROVED_SEEDS,
            repair_starts: true,
            max_kicks: local::MAX_KICKS,
            max_moves: usize::MAX,
            // The seed's own progress line would interleave with the
            // caller's (the CLI's spinner for the whole search).
            swapadvisor: crate::SwapAdvisor {
                progress_line: false,
                ..crate::SwapAdvisor::new(crate::swapadvisor::SearchSpace::Joint)
            },
            home: crate::Home {
                particles: HOME_FIRST_PARTICLES,
                ..crate::Home::default()
            },
            recompute_only: false,
            eager_seeds: true,
            home_runs: HOME_RUNS,
            streamed_seeds: true,
            offloaded_seeds: true,
            mixed_seeds: true,
            kept_link_seeds: true,
            prioritised: true,
            polish_swap_timing: true,
            held_starts: true,
            early_out_seeds: true,
            bounded_by_counts: false,
        }
    }
}

/// Generations of SwapAdvisor's seed (of its default population) in a
/// search bounded by counts ([`Joint::bounded_by_moves`]). A choice, kept
/// small: that seed is far from the fastest where the search matters (on
/// the GPT-2 export at 25% on `h100-80gb` its plan reads 0.122 s, the
/// search's 0.047 s), and the whole run at 3,000 moves per start, this
/// seed's 8 generations included, took 11 s there.
pub const COUNTED_GENERATIONS: u64 = 8;
/// The time limit a search bounded by counts runs as if it had: about
/// 31,700 years, so that no share of it ends a part of the search or paces
/// a repair (`local::RepairPace` judges a repair from the first quarter of
/// its start's share, years here, where 1e6 s gave hours that a run at
/// [`MAX_COUNTED_MOVES`] could reach), and finite, so that every deadline
/// derived from it is an `Instant` (1e12 s past now is far inside its
/// 64-bit seconds; module docs, "Bounded by counts").
pub const COUNTED_TIME_LIMIT_S: f64 = 1.0e12;
/// The largest move count the facade's input accepts for
/// [`Joint::bounded_by_moves`] (which itself takes any): a billion moves
/// per start is weeks of search on the suite's graphs.
pub const MAX_COUNTED_MOVES: u64 = 1_000_000_000;

impl Joint {
    /// This search ended by counts alone (module docs, "Bounded by
    /// counts"): at most `max_moves` scored moves per start and per phase
    /// of it, SwapAdvisor's seed [`COUNTED_GENERATIONS`] generations (its
    /// `max_generations` replaced), and the request's time limit not read,
    /// so that the same seed gives the same plan however fast the machine
    /// runs. Takes any count; the facade's input checks it against
    /// [`MAX_COUNTED_MOVES`].
    pub fn bounded_by_moves(self, max_moves: usize) -> Joint {
        Joint {
            max_moves,
            swapadvisor: crate::SwapAdvisor {
                max_generations: Some(COUNTED_GENERATIONS),
                ..self.swapadvisor
            },
            bounded_by_counts: true,
            ..self
        }
    }

    /// `outcore-recompute`: the search restricted to recomputation.
    pub fn recompute_only() -> Self {
        Joint {
            recompute_only: true,
            streamed_seeds: false,
            offloaded_seeds: false,
            mixed_seeds: false,
            polish_swap_timing: false,
            early_out_seeds: false,
            ..Joint::default()
        }
    }

    fn kinds(&self) -> moves::Kinds {
        if self.recompute_only {
            moves::Kinds::RecomputeOnly
        } else {
            moves::Kinds::All
        }
    }

    /// Whether `name` is a seed of this planner.
    fn seeds_from(&self, name: &str) -> bool {
        if matches!(name, NAME | RECOMPUTE_NAME | "ideal" | "none") {
            return false;
        }
        !self.recompute_only || name == "dtr" || name.starts_with("checkpoint")
    }
}

/// Seeds also run in the eager-update order (module docs): the fast,
/// rule-based planners whose plans the order changes most. The searches
/// (`home`, `swapadvisor`) run once, so that they keep their share of time.
pub const EAGER_ORDER_SEEDS: [&str; 6] = [
    "dtr",
    "window",
    "capuchin",
    "lms",
    "checkpoint-sqrt",
    "checkpoint-greedy",
];

/// Seeds that search until their share of the time is spent (or their
/// search converges); they run after every rule-based seed, so that they
/// share the time the others (milliseconds each) leave. Before, the seeds ran
/// in listing order and each took an equal share of what was left, so the
/// searches got about a fifth of the seeds' time and a second went unused
/// (ResNet-50 b64 at 75%: `home` ran 0.52 s inside `outcore` and 5 s alone,
/// where it ended 1% faster than `outcore`).
pub const SEARCH_SEEDS: [&str; 2] = ["home", "swapadvisor"];

/// The seed planners whose plans only keep and swap (no recomputation),
/// skipped where the swap-only bound says they cannot give a start
/// (`Joint::swap_only_skip`); the rule-based ones among them run after the
/// streamed and mixed seeds ([`Job::SwapOnly`]).
pub const SWAP_ONLY_SEEDS: [&str; 8] = [
    "vdnn-all",
    "vdnn-conv",
    "vdnn-all-sync",
    "vdnn-conv-sync",
    "lms",
    "window",
    "odswap",
    "swapadvisor",
];

/// Rule-based seeds that run after the streamed and mixed seeds, as the
/// swap-only ones do, though they recompute too (so no bound skips them).
/// `tensile` takes up to 0.61 s a case on the benchmark suite, as much where
/// its greedy finds no plan (the PyTorch GPT-2 export at 25% on
/// `h100-80gb`: 0.47 s), and run before the streamed seeds it took their share: in 4 of
/// 8 runs of 5 s there (2026-12-02) the export's streamed seeds were never
/// made, and the plan fell from 0.67-0.70 to 0.355 of ideal.
pub const LATE_SEEDS: [&str; 1] = ["tensile"];

/// The relative margin by which the swap-only bound must exceed the start
/// floor for `Joint::swap_only_skip` (and by which a swap-only seed may
/// fall below the bound before the skip is distrusted): rounding only.
const SKIP_MARGIN: f64 = 1e-6;

/// One seed per [`seed_family`], fastest first, with its schedule: each
/// family's fastest seed that has one (ties to the earlier seed).
/// [`Joint::starts`] starts the local search from the first
/// [`IMPROVED_SEEDS`] of them, and `Joint::swap_only_skip` asks where the
/// last of those would be.
fn family_leaders(seeds: &[Seed]) -> Vec<(&Seed, &Schedule)> {
    let mut by_time: Vec<(&Seed, &Schedule)> = seeds
        .iter()
        .filter_map(|s| Some((s, s.plan.lowered_from.as_deref()?)))
        .collect();
    by_time.sort_by(|a, b| a.0.iter_time_s.total_cmp(&b.0.iter_time_s));
    let mut families: Vec<&str> = Vec::new();
    by_time.retain(|&(s, _)| {
        let family = seed_family(s);
        let first = !families.contains(&family);
        if first {
            families.push(family);
        }
        first
    });
    by_time
}

/// The time of the `n`-th fastest seed family ([`family_leaders`]); `None`
/// with fewer families.
fn nth_family_time_s(seeds: &[Seed], n: usize) -> Option<f64> {
    family_leaders(seeds)
        .get(n.checked_sub(1)?)
        .map(|(s, _)| s.iter_time_s)
}

/// The fastest variant of `schedule` with its offloaded states turned
/// around ([`early_out`]) and its large offloaded parameters kept across the
/// iteration's turn where that is faster ([`kept_across_pass`]), each then
/// finished (its swaps' copy-outs started early and its reclaim points
/// re-timed where faster, `finished`), beside how many states it offloads.
/// `None`: no variant feasible, or none that changes anything but the
/// states' count faster than `schedule`.
fn early_out_variant(request: &PlanRequest<'_>, schedule: &Schedule) -> (usize, Option<EarlyOut>) {
    let ctx = Ctx::new(request.graph, request.cost, schedule.order.clone());
    let chosen = early_out::candidates(&ctx, schedule);
    let search = Search::new(&ctx, request, NAME);
    let mut scratch = Scratch::default();
    let mut score = |s: &Schedule| match search.score(s, &mut scratch) {
        Ok(Score::Feasible { iter_time_s, .. }) => Some(iter_time_s),
        _ => None,
    };
    // States turned around first, then parameters kept across the turn in
    // the memory left; and parameters kept first, then states turned around
    // in what is left: the states held at the turn and a large parameter
    // kept there compete for the same memory (on the PyTorch GPT-2 export
    // at a quarter of its footprint, the token embedding kept across did
    // not fit beside the 32 states its seed's sweep turned around).
    // Only large parameters: each try costs an evaluation (20 ms and more on
    // the suite's largest graphs, three seeds each), and a small one's two
    // copies are short.
    let min_bytes = (request.budget_bytes as f64 * KEPT_ACROSS_SHARE) as u64;
    let turn = |s: &Schedule, score: &mut dyn FnMut(&Schedule) -> Option<f64>| {
        if chosen.is_empty() {
            return None;
        }
        early_out_count(chosen.len(), &mut |count: usize| {
            let turned = early_out::turned_around(&ctx, request.cost, s, &chosen, count)?;
            Some((score(&turned)?, count, turned))
        })
    };
    let mut variants: Vec<EarlyOut> = Vec::new();
    if let Some((time_s, count, turned)) = turn(schedule, &mut score) {
        let (time_s, kept, schedule) =
            kept_across_pass(&ctx, request.cost, min_bytes, &mut score, (time_s, turned));
        variants.push(EarlyOut::new(time_s, count, kept, schedule));
    }
    if early_out::boundary_candidates(&ctx, schedule)
        .first()
        .is_some_and(|&t| ctx.size(t) >= min_bytes)
        && let Some(time_s) = score(schedule)
    {
        let (time_s, kept, kept_schedule) = kept_across_pass(
            &ctx,
            request.cost,
            min_bytes,
            &mut score,
            (time_s, schedule.clone()),
        );
        if kept > 0 {
            let (time_s, count, schedule) = turn(&kept_schedule, &mut score)
                .filter(|t| t.0 < time_s)
                .unwrap_or((time_s, 0, kept_schedule));
            variants.push(EarlyOut::new(time_s, count, kept, schedule));
        }
    }
    // With no variant, the schedule itself, kept only where finishing it
    // makes it faster.
    let unchanged = variants.is_empty();
    if unchanged && let Some(time_s) = score(schedule) {
        variants.push(EarlyOut::new(time_s, 0, 0, schedule.clone()));
    }
    // Each finished, then the fastest: what finishing gains differs by
    // variant (on the PyTorch GPT-2 export at a quarter of its footprint on
    // `v100-16gb-pcie3`, 32 states turned went from 0.3278 s to 0.2817 s,
    // 14%, and 1 state with the token embedding kept across from 0.3189 s
    // to 0.2579 s, 19%), so the fastest before need not be the fastest
    // after; no case of the suite was seen to flip. At most two variants.
    let fastest = variants
        .into_iter()
        .map(|v| finished(&ctx, request.cost, &mut score, v))
        .min_by(|a, b| a.time_s.total_cmp(&b.time_s))
        .filter(|v| !unchanged || v.early_copies > 0 || v.requeued > 0);
    (chosen.len(), fastest)
}

/// `v` with its swaps' copy-outs started early where the d2h link has
/// room ([`early_out::copied_out_early`]) and then its reclaim points
/// re-timed behind the d2h queue ([`requeue::fastest_requeued`]), each
/// kept where `score` finds it faster.
fn finished(
    ctx: &Ctx<'_>,
    cost: &dyn outcore_cost::CostModel,
    score: &mut impl FnMut(&Schedule) -> Option<f64>,
    mut v: EarlyOut,
) -> EarlyOut {
    if let Some(early) = early_out::copied_out_early(ctx, cost, &v.schedule)
        && let Some(early_s) = score(&early.schedule)
        && early_s < v.time_s
    {
        v.time_s = early_s;
        v.early_copies = early.copies;
        v.schedule = early.schedule;
    }
    if let Some(r) = requeue::fastest_requeued(ctx, cost, &v.schedule, v.time_s, score) {
        v.time_s = r.time_s;
        v.requeued = r.moved;
        v.schedule = r.schedule;
    }
    v
}

/// A variant of [`early_out_variant`]: its time, how many states it turned
/// around and how many parameters it keeps across the turn.
struct EarlyOut {
    time_s: f64,
    count: usize,
    kept: usize,
    /// Swaps whose copy-outs start early ([`early_out::copied_out_early`]).
    early_copies: usize,
    /// Reclaim points re-timed behind the d2h queue
    /// ([`requeue::fastest_requeued`]).
    requeued: usize,
    schedule: Schedule,
}

impl EarlyOut {
    /// A variant with no copy-out started early.
    fn new(time_s: f64, count: usize, kept: usize, schedule: Schedule) -> EarlyOut {
        EarlyOut {
            time_s,
            count,
            kept,
            early_copies: 0,
            requeued: 0,
            schedule,
        }
    }

    /// What it changed, for a seed's or a run's label.
    fn label(&self, candidates: usize) -> String {
        let mut label = format!("{} of {candidates} states", self.count);
        if self.kept > 0 {
            label.push_str(&format!(", {} kept across iterations", self.kept));
        }
        if self.early_copies > 0 {
            label.push_str(&format!(", {} copied out early", self.early_copies));
        }
        if self.requeued > 0 {
            label.push_str(&format!(", {} reclaims requeued", self.requeued));
        }
        label
    }
}

/// Offloaded parameters kept on the device across the iteration's turn
/// ([`early_out::kept_across`]), the largest of
/// [`early_out::boundary_candidates`] first, at most [`KEPT_ACROSS_TRIES`]
/// tried, each kept where `score` finds the schedule faster; `start` is the
/// schedule with its time, and the result how many were kept.
fn kept_across_pass(
    ctx: &Ctx<'_>,
    cost: &dyn outcore_cost::CostModel,
    min_bytes: u64,
    score: &mut impl FnMut(&Schedule) -> Option<f64>,
    start: (f64, Schedule),
) -> (f64, usize, Schedule) {
    let (mut time_s, mut schedule) = start;
    let mut kept = 0;
    for t in early_out::boundary_candidates(ctx, &schedule)
        .into_iter()
        .take_while(|&t| ctx.size(t) >= min_bytes)
        .take(KEPT_ACROSS_TRIES)
    {
        let candidate = early_out::kept_across(ctx, cost, &schedule, t);
        if let Some(s) = score(&candidate)
            && s < time_s
        {
            (time_s, schedule) = (s, candidate);
            kept += 1;
        }
    }
    // Then the smaller ones all at once, shortest turn first, by count:
    // one at a time they are an evaluation each for a copy of a millisecond
    // or less (see `early_out::shortest_turn_first`).
    let small = early_out::shortest_turn_first(ctx, &schedule, min_bytes);
    if !small.is_empty()
        && let Some((s, count, candidate)) = early_out_count(small.len(), &mut |count: usize| {
            let candidate = early_out::kept_across_all(ctx, cost, &schedule, &small[..count]);
            Some((score(&candidate)?, count, candidate))
        })
        && s < time_s * (1.0 - KEPT_BATCH_MIN_GAIN)
    {
        (time_s, schedule) = (s, candidate);
        kept += count;
    }
    (time_s, kept, schedule)
}

/// The share of a seed's time the small parameters kept across the turn
/// together must save to be kept. What they hold at the turn is memory the
/// search from the seed can no longer spend: on ViT-B/16 b64 at 12.5% on
/// `h100-80gb` (`outcore plan ... --seconds 5`), 6 kept made a seed 0.1%
/// faster (0.1810 s against 0.1812 s) and the plan 1.9% slower (0.1800 s
/// against 0.1766 s, two runs each); on the PyTorch GPT-2 export at 25% on
/// `v100-16gb-pcie3` 8 kept made a seed 1.3% faster.
pub const KEPT_BATCH_MIN_GAIN: f64 = 0.005;

/// Parameters `kept_across_pass` tries, the largest first: each costs an
/// evaluation, and one only pays where its two copies are long.
pub const KEPT_ACROSS_TRIES: usize = 4;
/// The share of the budget from which `kept_across_pass` tries a parameter
/// (the streamed seeds' `streamed::LARGE_SHARE`).
pub const KEPT_ACROSS_SHARE: f64 = streamed::LARGE_SHARE;

/// The fastest of the turned-around variants `score` makes (`None`: none
/// feasible) for counts of states up to `n`: the powers of two below `n`
/// and `n` itself, ascending, until [`EARLY_OUT_PATIENCE`] in a row are no
/// faster than the fastest so far (more states hold more memory, so the
/// time rarely falls again once it rises, and infeasible counts stay
/// infeasible), then the midpoints on either side of the fastest of
/// those. Measured on the PyTorch GPT-2 export at 50% of its footprint:
/// the fastest variants turned 2 of one seed's 296 states around and 32 of
/// another's 294, and 74 or more were over the budget. A fixed share misses
/// one or the other.
fn early_out_count<T>(
    n: usize,
    score: &mut impl FnMut(usize) -> Option<(f64, usize, T)>,
) -> Option<(f64, usize, T)> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |&c| Some(c * 2))
        .take_while(|&c| c < n)
        .chain(std::iter::once(n))
        .collect();
    let mut best: Option<(f64, usize, T)> = None;
    let keep = |candidate: Option<(f64, usize, T)>, best: &mut Option<(f64, usize, T)>| {
        if let Some(c) = candidate
            && best.as_ref().is_none_or(|b| c.0 < b.0)
        {
            *best = Some(c);
        }
    };
    let mut worse_in_a_row = 0;
    let mut scored = 0;
    for &count in &counts {
        scored += 1;
        let before = best.as_ref().map(|b| b.0);
        keep(score(count), &mut best);
        let improved = best.as_ref().map(|b| b.0) != before;
        worse_in_a_row = if improved { 0 } else { worse_in_a_row + 1 };
        if worse_in_a_row == EARLY_OUT_PATIENCE {
            break;
        }
    }
    counts.truncate(scored);
    let c = best.as_ref()?.1;
    let i = counts.iter().position(|&x| x == c).unwrap_or(0);
    let mut around: Vec<usize> = Vec::new();
    if i > 0 {
        around.push((counts[i - 1] + c) / 2);
    }
    if i + 1 < counts.len() {
        around.push((c + counts[i + 1]) / 2);
    }
    counts.sort_unstable();
    for count in around {
        if counts.binary_search(&count).is_err() {
            keep(score(count), &mut best);
        }
    }
    best
}

/// Seeds whose offloaded optimizer states are turned around
/// (`Joint::add_early_out_seeds`), the fastest with any.
///
/// Why four: the fastest seed before the turn is often not the fastest
/// after it. On the PyTorch GPT-2 export at 50% on `h100-80gb`, once the
/// streamed seed of every persistent tensor kept its latency-bound tensors
/// resident (`streamed::latency_bound`) it moved ahead of the streamed
/// optimizer state (0.0440 s against 0.0443 s) and pushed it out of the
/// three turned around; turned around, that seed is 0.0388 s and the plan
/// 0.0384 s, and without it the plan was 0.0400 s.
pub const EARLY_OUT_SEEDS: usize = 4;
/// Only seeds at most this much slower than the fastest are turned around:
/// each count costs an evaluation of the local search's time (about 30 ms
/// on BERT-base b32 at 12.5%, where all three seeds' sweeps took a second of
/// a 5 s limit), and a seed far behind rarely ends fastest.
pub const EARLY_OUT_WITHIN: f64 = 1.25;
/// Counts of the sweep (`early_out_count`) in a row no faster than the
/// fastest before it stops doubling.
pub const EARLY_OUT_PATIENCE: usize = 2;

/// The first swarm's size of `home` inside `outcore` (see
/// `Joint::home_restarts`).
pub const HOME_FIRST_PARTICLES: usize = 32;
/// The largest swarm of `home`'s restarts inside `outcore`.
pub const HOME_MAX_PARTICLES: usize = 1024;
/// Runs of HOME inside `outcore`, at most: 32 to 1024 particles. The time
/// limit ends them sooner (at `--seconds 5`, three ran on ResNet-50 b64 at
/// 50% on `h100-80gb`: 32, 64 and 128 particles); the bound
/// keeps a long time limit from restarting a converged search for hours.
pub const HOME_RUNS: usize = 6;
/// The part of HOME's share its first swarm inside `outcore` may take.
const HOME_FIRST_SHARE: f64 = 0.5;
/// A restart is not begun with less than this left of HOME's share.
const HOME_MIN_RESTART_S: f64 = 0.05;

/// A seed this planner makes itself (`kind`: streamed, offloaded) proven as
/// a plan under the joint planner's name, with its name in the settings
/// under `kind`.
fn prove_seed(
    request: &PlanRequest<'_>,
    kind: &str,
    name: &str,
    schedule: Schedule,
) -> Result<PlanOutcome, PlannerError> {
    let ctx = Ctx::new(request.graph, request.cost, schedule.order.clone());
    let search = Search::new(&ctx, request, NAME);
    let score = search.score(&schedule, &mut Scratch::default())?;
    search.prove(
        Scored {
            settings: json!({ kind: name }),
            schedule: Some(schedule),
            score,
        },
        &[],
    )
}

/// The budget a merge's recomputation planner plans for next, as the merge
/// rounds of [`streamed`] and [`offloaded`] lower it: over the request's
/// budget by `e` bytes, the next is `e` lower (at least 0.5% of the budget,
/// so that the rounds do not creep by a few bytes); where the planner has
/// no plan, halfway between there and the last budget whose merge was over.
#[derive(Debug, Clone, Copy)]
struct MergeBudget {
    /// The last budget whose merge was over the request's budget.
    over: u64,
    /// The last budget at which the planner had no plan.
    no_plan: u64,
    next: u64,
}

impl MergeBudget {
    fn new(first_bytes: u64) -> Self {
        MergeBudget {
            over: first_bytes,
            no_plan: 0,
            next: first_bytes,
        }
    }

    /// The budget to plan for next; `None` once the bisection has closed.
    fn next(&self) -> Option<u64> {
        (self.next > self.no_plan).then_some(self.next)
    }

    /// The planner had no plan at [`MergeBudget::next`].
    fn no_plan(&mut self) {
        self.no_plan = self.next;
        self.halve();
    }

    /// The merge planned at [`MergeBudget::next`] needs `needed_bytes`
    /// against the request's `budget_bytes`.
    fn over_by(&mut self, needed_bytes: u64, budget_bytes: u64) {
        let excess = needed_bytes
            .saturating_sub(budget_bytes)
            .max(budget_bytes / 200);
        self.over = self.next;
        self.next = self.next.saturating_sub(excess);
        if self.next <= self.no_plan {
            self.halve();
        }
    }

    fn halve(&mut self) {
        self.next = self.no_plan + (self.over - self.no_plan) / 2;
    }

    /// Judges the score of the merge planned at [`MergeBudget::next`]
    /// against the request's `budget_bytes`: within it, the merge is the
    /// one; over it, the next budget is lowered by the excess
    /// ([`MergeBudget::over_by`]) and the rounds go on; anything else (no
    /// plan the evaluator accepts) ends them.
    fn judge(
        &mut self,
        score: Result<Score, outcore_plan::PlannerError>,
        budget_bytes: u64,
    ) -> Verdict {
        match score {
            Ok(Score::Feasible { iter_time_s, .. }) => Verdict::Fits { iter_time_s },
            Ok(Score::OverBudget { needed_bytes, .. }) => {
                self.over_by(needed_bytes, budget_bytes);
                Verdict::Lower
            }
            Ok(_) | Err(_) => Verdict::Stop,
        }
    }
}

/// What a merge round made at the budget [`run_merge_rounds`] gave it.
enum Round {
    /// The recomputation planner had no plan at that budget.
    NoPlan,
    /// Plan again at the same budget (the round changed what it plans around).
    Again,
    /// The merge, to be scored against the request's budget.
    Merged(Schedule),
}

/// The merge rounds of [`kept`], [`offloaded`] and [`streamed`]: at most
/// `rounds` calls of `round` at the budgets [`MergeBudget`] gives (from
/// `first_bytes`), until `until`; `round` returning `None` ends them. The
/// first merge within the request's budget and its time.
fn run_merge_rounds(
    request: &PlanRequest<'_>,
    ctx: &Ctx<'_>,
    first_bytes: u64,
    rounds: usize,
    until: Instant,
    mut round: impl FnMut(u64) -> Option<Round>,
) -> Option<(f64, Schedule)> {
    let search = Search::new(ctx, request, NAME);
    let mut scratch = Scratch::default();
    let mut budget = MergeBudget::new(first_bytes);
    for _ in 0..rounds {
        let next = budget.next()?;
        if Instant::now() >= until {
            return None;
        }
        match round(next)? {
            Round::NoPlan => budget.no_plan(),
            Round::Again => {}
            Round::Merged(schedule) => {
                let score = search.score(&schedule, &mut scratch);
                match budget.judge(score, request.budget_bytes) {
                    Verdict::Fits { iter_time_s } => return Some((iter_time_s, schedule)),
                    Verdict::Lower => {}
                    Verdict::Stop => return None,
                }
            }
        }
    }
    None
}

/// What [`MergeBudget::judge`] says of one merge round.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// The merge fits the request's budget and simulates in `iter_time_s`.
    Fits { iter_time_s: f64 },
    /// The merge was over the budget; plan again at the lowered budget.
    Lower,
    /// No merge of these rounds will do.
    Stop,
}

/// The seeds this planner makes itself for `job` (a streamed, offloaded,
/// kept-link or mixed job) on `order`, planned for `share_s` seconds, each
/// named after its kind; `counted`: the search is bounded by counts
/// ([`Joint::bounded_by_moves`]).
fn own_seeds(
    request: &PlanRequest<'_>,
    job: &Job<'_>,
    order: Option<&[OpId]>,
    share_s: f64,
    counted: bool,
) -> Vec<(String, Result<PlanOutcome, PlannerError>)> {
    let share = Duration::try_from_secs_f64(share_s).unwrap_or_default();
    let until = Instant::now() + share;
    match job {
        Job::Streamed(_) => streamed::streamed_seeds(request, order, until, counted),
        Job::Offloaded(_) => offloaded::offloaded_seeds(request, order, until),
        Job::Mixed(_) => mixed::mixed_seeds(request, order, until),
        _ => kept::kept_link_seed(request, order, until)
            .map(|outcome| (kept::NAME.to_string(), outcome))
            .into_iter()
            .collect(),
    }
}

/// What counts as one planner when the starts are chosen
/// ([`Joint::starts`]): the planner's name, or for the seeds this planner
/// makes itself (streamed, offloaded) the kind, the first word of the
/// seed's name, so that one kind does not take the other's start. A
/// choice, not a measured gain: on the PyTorch ResNet-50 b32 export at 25%
/// on `h100-80gb` the offloaded seed (38.8 ms) had taken the streamed
/// one's start (39.6 ms), whose search used to end at 38.3 ms; with this
/// rule the streamed seed gets a start again but a single share, and the
/// plan stays at 38.7 ms. On the suite it moved no case by more than the
/// noise of a 5 s search (RESULTS.md, "Offloaded-activation seeds").
fn seed_family(seed: &Seed) -> &str {
    let planner = seed.plan.planner.name.as_str();
    if planner == NAME {
        // A seed turned around ([`early_out`]) is of its origin's family, so
        // that it takes that seed's start where it is faster and no other
        // family's: the origin's name follows the prefix, and its first word
        // is the origin's planner or kind.
        let name = seed
            .name
            .strip_prefix(EARLY_OUT_PREFIX)
            .unwrap_or(&seed.name);
        name.split_whitespace().next().unwrap_or(planner)
    } else {
        planner
    }
}

/// The name of a seed turned around ([`early_out`]) is this and its origin's.
const EARLY_OUT_PREFIX: &str = "early-out ";

/// One seed job of [`Joint::run_seeds`].
enum Job<'a> {
    /// A planner on an order (`None`: the request's).
    Planner(&'a dyn Planner, Option<&'a [OpId]>),
    /// A rule-based planner of [`SWAP_ONLY_SEEDS`] on an order, run after
    /// the streamed and mixed seeds and skipped where the swap-only bound
    /// rules its plan out as a start (`Joint::swap_only_skip`).
    SwapOnly(&'a dyn Planner, Option<&'a [OpId]>),
    /// The streamed seeds ([`streamed`]) on an order.
    Streamed(Option<&'a [OpId]>),
    /// The offloaded-activation seeds ([`offloaded`]) on an order.
    Offloaded(Option<&'a [OpId]>),
    /// The kept-link seed ([`kept`]) on an order.
    Kept(Option<&'a [OpId]>),
    /// The mixed seeds ([`mixed`]) on an order.
    Mixed(Option<&'a [OpId]>),
}

impl Job<'_> {
    /// Its weight in the split of the seeds' time among the jobs before
    /// it: 0 for a [`Job::SwapOnly`] (a rule-based seed, which hands on
    /// what it does not use), so that moving it after the streamed seeds
    /// takes nothing from their share.
    fn weight(&self) -> f64 {
        match self {
            Job::Planner(p, _) => seed_weight(p.name()),
            Job::SwapOnly(..) => 0.0,
            Job::Streamed(_) => STREAMED_WEIGHT,
            Job::Offloaded(_) | Job::Kept(_) | Job::Mixed(_) => 1.0,
        }
    }

    /// Its own weight when its share is taken: that of any rule-based seed.
    fn own_weight(&self) -> f64 {
        match self {
            Job::SwapOnly(..) => 1.0,
            _ => self.weight(),
        }
    }
}

/// The seeds' answers so far.
#[derive(Default)]
struct SeedSet {
    seeds: Vec<Seed>,
    infeasible: Vec<Infeasible>,
    errors: Vec<Value>,
    /// Seed planners not run, with why (`Joint::swap_only_skip`).
    skipped: Vec<Value>,
}

impl SeedSet {
    /// Keeps one seed planner's outcome: a feasible plan with its time under
    /// `request`'s evaluator, an infeasibility, or an error (only an invalid
    /// request stops `outcore`).
    fn record(
        &mut self,
        planner: &'static str,
        request: &PlanRequest<'_>,
        name: String,
        outcome: Result<PlanOutcome, PlannerError>,
    ) -> Result<(), PlannerError> {
        match outcome {
            Ok(PlanOutcome::Feasible(plan)) => {
                if let Some(iter_time_s) = seed_time(planner, request, &plan)? {
                    self.seeds.push(Seed {
                        name,
                        plan,
                        iter_time_s,
                    });
                }
            }
            Ok(PlanOutcome::Infeasible(why)) => self.infeasible.push(why),
            Err(e) if e.kind == PlannerErrorKind::InvalidRequest => return Err(e),
            Err(e) => self
                .errors
                .push(json!({"planner": name, "error": e.to_string()})),
        }
        Ok(())
    }
}

/// One seed's answer.
struct Seed {
    /// The planner's name, with " (eager order)" for a seed planned in the
    /// eager-update order.
    name: String,
    plan: Box<Plan>,
    /// Its time under this planner's evaluator (the seeds' own scoring path).
    iter_time_s: f64,
}

impl Planner for Joint {
    fn name(&self) -> &'static str {
        if self.recompute_only {
            RECOMPUTE_NAME
        } else {
            NAME
        }
    }

    fn description(&self) -> &'static str {
        if self.recompute_only {
            "outcore's search restricted to recomputation: the recompute-only planners as seeds, then local search over keep / recompute on the evaluator"
        } else {
            "outcore's own: every planner as a seed, then local search over keep / swap / recompute and swap timing on the evaluator"
        }
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let started = Instant::now();
        // Every seed, merge and search below needs the graph's fingerprint:
        // computed once here instead of once (or twice) by each of them.
        let fingerprint = request.graph_fingerprint();
        let request = &PlanRequest {
            fingerprint: Some(&fingerprint),
            time_limit_s: if self.bounded_by_counts {
                COUNTED_TIME_LIMIT_S
            } else {
                request.time_limit_s
            },
            ..*request
        };
        let total = Duration::try_from_secs_f64(request.time_limit_s.max(0.0))
            .unwrap_or(Duration::from_secs(u64::MAX / 4));
        let seeds_until = started + seeds_time(total);
        std::thread::scope(|scope| {
            // The bound's program start needs nothing from the seeds: it is
            // solved beside them (see `ProgramStart`).
            let program = ProgramStart::spawn(self, request, scope);
            let deadline = started.checked_add(total).unwrap_or(started);
            self.seed_and_improve(request, seeds_until, deadline, program)
        })
    }
}

impl Joint {
    /// [`Planner::plan`] once the program start is under way: the seeds
    /// until `seeds_until`, then the local search from the fastest of them
    /// and the repair starts (`program` among them) until `deadline`.
    fn seed_and_improve(
        &self,
        request: &PlanRequest<'_>,
        seeds_until: Instant,
        deadline: Instant,
        program: ProgramStart<'_>,
    ) -> Result<PlanOutcome, PlannerError> {
        let SeedSet {
            mut seeds,
            infeasible,
            errors: mut seed_errors,
            skipped,
        } = self.run_seeds(request, seeds_until)?;
        if seeds.is_empty() {
            return Ok(PlanOutcome::Infeasible(no_seed(request, infeasible)));
        }
        if self.early_out_seeds {
            self.add_early_out_seeds(request, &mut seeds, &mut seed_errors)?;
        }
        seeds.sort_by(|a, b| a.iter_time_s.total_cmp(&b.iter_time_s));
        let seed_summary: Vec<Value> = seeds
            .iter()
            .map(|s| json!({"planner": s.name, "iter_time_s": s.iter_time_s}))
            .collect();
        let context = Context {
            request,
            seed_summary: &seed_summary,
            seed_errors: &seed_errors,
            seeds_skipped: &skipped,
        };
        self.improve_best(&context, seeds, program, deadline)
    }
}

/// The start from the bound's cut program ([`program::program_start`]),
/// solved on a thread of its own while the seeds run.
///
/// Why: the program is one linear program, solved on one thread, and
/// needs nothing from the seeds. Solved after them, as it was, its time
/// came out of the local search's while the other core idled. On
/// DenseNet-121 b64 at 12.5% on `h100-80gb` (`--seconds 5`) the seeds
/// ended at 2.24 s and the program then took 1.41 s, half of what was
/// left; a `perf` profile of the run showed one busy core from 2.5 s to
/// 3.5 s. On the PyTorch GPT-2 export at 25% it took 0.19 s, on BERT-base
/// b32 at 25% on `v100-16gb-pcie3` 0.32 s. Beside the seeds it takes the
/// core they leave idle (most seeds are single-threaded rule-based
/// planners), and what it takes from the parallel ones the OS shares out.
/// Where some op's working set alone is over the budget the program
/// returns at once (`outcore_bound::forward_end_program`).
///
/// The price: where no seed has a plan (or one fails), the answer waits
/// for the solve, which the thread's scope joins before `plan` returns.
enum ProgramStart<'scope> {
    /// Not wanted: no repair starts, or the recompute-only search, where
    /// its swaps have no place.
    Unwanted,
    /// Being solved on its own thread.
    Solving(std::thread::ScopedJoinHandle<'scope, Option<Schedule>>),
    /// To be solved when asked for: no thread could be started.
    Inline,
}

impl<'scope> ProgramStart<'scope> {
    /// Starts solving the program for `request` on a thread of `scope`,
    /// where `joint` wants its start.
    fn spawn<'env>(
        joint: &Joint,
        request: &'env PlanRequest<'_>,
        scope: &'scope std::thread::Scope<'scope, 'env>,
    ) -> Self {
        if !joint.repair_starts || joint.recompute_only {
            return ProgramStart::Unwanted;
        }
        std::thread::Builder::new()
            .name("outcore-program-start".into())
            .stack_size(PROGRAM_STACK_BYTES)
            .spawn_scoped(scope, move || program::program_start(request))
            .map_or(ProgramStart::Inline, ProgramStart::Solving)
    }

    /// The start, waiting for the solve where it is still running. A panic
    /// on the solver's thread is raised again here, as it would have been
    /// had the program been solved on this one.
    fn join(self, request: &PlanRequest<'_>) -> Option<Schedule> {
        match self {
            ProgramStart::Unwanted => None,
            ProgramStart::Solving(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            ProgramStart::Inline => program::program_start(request),
        }
    }
}

/// The program thread's stack: the main thread's usual 8 MiB, where the
/// program was solved before it had a thread of its own.
const PROGRAM_STACK_BYTES: usize = 8 << 20;

/// What every candidate's settings record.
struct Context<'a, 'r> {
    request: &'a PlanRequest<'r>,
    seed_summary: &'a [Value],
    seed_errors: &'a [Value],
    seeds_skipped: &'a [Value],
}

impl Joint {
    /// The planners whose plans are seeds, `swapadvisor` with this
    /// planner's settings.
    fn seed_planners(&self) -> Vec<Box<dyn Planner>> {
        crate::all()
            .into_iter()
            .filter(|p| self.seeds_from(p.name()))
            // `home`'s entry only places it among the jobs: its runs are
            // `home_restarts`', with `self.home`'s settings.
            .map(|p| match p.name() {
                "swapadvisor" => Box::new(self.swapadvisor.clone()) as Box<dyn Planner>,
                _ => p,
            })
            .collect()
    }

    /// The seed jobs in the order they run, on `order` (the request's) and
    /// `eager` (the eager-update order, where it differs).
    fn seed_jobs<'a>(
        &self,
        order: Option<&'a [OpId]>,
        planners: &'a [Box<dyn Planner>],
        eager: Option<&'a [OpId]>,
    ) -> Vec<Job<'a>> {
        // The rule-based planners first, each in the request's order and the
        // fast ones again in the eager-update order; then the kept-link,
        // offloaded, streamed and mixed seeds (in the same orders); then the
        // late ones ([`LATE_SEEDS`]); then the rule-based planners that keep
        // and swap only (`Job::SwapOnly`),
        // where the swap-only bound can tell that they could not give a
        // start; then the searches, which share what the others leave of the
        // seeds' time.
        let mut jobs: Vec<Job<'a>> = Vec::new();
        let mut swap_only: Vec<Job<'a>> = Vec::new();
        let mut late: Vec<Job<'a>> = Vec::new();
        for planner in planners
            .iter()
            .filter(|p| !SEARCH_SEEDS.contains(&p.name()))
        {
            let orders = std::iter::once(order).chain(
                eager
                    .filter(|_| EAGER_ORDER_SEEDS.contains(&planner.name()))
                    .map(Some),
            );
            for order in orders {
                if SWAP_ONLY_SEEDS.contains(&planner.name()) {
                    swap_only.push(Job::SwapOnly(planner.as_ref(), order));
                } else if LATE_SEEDS.contains(&planner.name()) {
                    late.push(Job::Planner(planner.as_ref(), order));
                } else {
                    jobs.push(Job::Planner(planner.as_ref(), order));
                }
            }
        }
        // The offloaded-activation seeds before the streamed ones: they take
        // a few hundredths of a second and hand the rest on, where after
        // them their weight would come out of the streamed seeds' share (on
        // the PyTorch GPT-2 export at 25% that share is what decides whether
        // its only streamed seed is made in 5 s).
        if self.kept_link_seeds {
            jobs.push(Job::Kept(order));
            if let Some(eager) = eager {
                jobs.push(Job::Kept(Some(eager)));
            }
        }
        if self.offloaded_seeds {
            jobs.push(Job::Offloaded(order));
            if let Some(eager) = eager {
                jobs.push(Job::Offloaded(Some(eager)));
            }
        }
        // Streamed seeds in both orders: neither wins everywhere (at 25% on
        // `v100-16gb-pcie3`, BERT-base b32 got 0.71 of ideal in the eager
        // order and 0.65 in the graph's; at 12.5% ViT-B/16 b64 got a plan
        // only in the graph's order).
        if self.streamed_seeds {
            jobs.push(Job::Streamed(order));
            if let Some(eager) = eager {
                jobs.push(Job::Streamed(Some(eager)));
            }
        }
        // After the streamed seeds, whose time they would otherwise take.
        if self.mixed_seeds {
            jobs.push(Job::Mixed(order));
            if let Some(eager) = eager {
                jobs.push(Job::Mixed(Some(eager)));
            }
        }
        jobs.append(&mut late);
        jobs.append(&mut swap_only);
        for planner in planners.iter().filter(|p| SEARCH_SEEDS.contains(&p.name())) {
            jobs.push(Job::Planner(planner.as_ref(), order));
        }
        jobs
    }

    /// Runs every other planner until `until`; returns the feasible seeds (with
    /// their schedules' times under the evaluator), the infeasibilities, the
    /// seeds' errors and the planners skipped, as JSON.
    fn run_seeds(
        &self,
        request: &PlanRequest<'_>,
        mut until: Instant,
    ) -> Result<SeedSet, PlannerError> {
        let planners = self.seed_planners();
        let eager = self.eager_order(request);
        let jobs = self.seed_jobs(request.order, &planners, eager.as_deref());
        let mut out = SeedSet::default();
        // The swap-only lower bound, computed once where first asked for.
        let mut bound_s: Option<Option<f64>> = None;
        for (i, job) in jobs.iter().enumerate() {
            let left_s = until
                .saturating_duration_since(Instant::now())
                .as_secs_f64();
            // A swap-only job counts the swap-only jobs after it at their
            // own weight, so that each gets its part of what is left rather
            // than that of the searches alone.
            let own = jobs[i].own_weight();
            let weight_after = match job {
                Job::SwapOnly(..) => Job::own_weight,
                _ => Job::weight,
            };
            let rest: f64 = jobs[i + 1..].iter().map(weight_after).sum();
            let share_s = left_s * own / (own + rest);
            let order_name = |order: Option<&[OpId]>| {
                if order.is_some() && request.order.is_none() {
                    " (eager order)"
                } else {
                    ""
                }
            };
            let (planner, order) = match *job {
                Job::Planner(planner, order) | Job::SwapOnly(planner, order) => (planner, order),
                Job::Streamed(order)
                | Job::Offloaded(order)
                | Job::Kept(order)
                | Job::Mixed(order) => {
                    for (name, outcome) in
                        own_seeds(request, job, order, share_s, self.bounded_by_counts)
                    {
                        let name = format!("{name}{}", order_name(order));
                        out.record(self.name(), request, name, outcome)?;
                    }
                    continue;
                }
            };
            let sub = PlanRequest {
                time_limit_s: share_s,
                order,
                ..*request
            };
            if planner.name() == "home" {
                let unused = self.home_seeds(&sub, request, &mut out)?;
                until = until.checked_sub(unused).unwrap_or(until);
                continue;
            }
            let name = format!("{}{}", planner.name(), order_name(order));
            if let Some(why) =
                self.swap_only_skip(request, &name, planner.name(), &out.seeds, &mut bound_s)
            {
                // Its share goes to the jobs after it, or (`swapadvisor`,
                // the last) to the local search, which starts when the
                // seeds end.
                out.skipped.push(why);
                continue;
            }
            let outcome = planner.plan(&sub);
            out.record(self.name(), request, name, outcome)?;
        }
        Ok(out)
    }

    /// Why `planner`, a seed that keeps and swaps only, need not run: the
    /// swap-only lower bound is slower than the [`IMPROVED_SEEDS`]-th
    /// fastest family among `seeds`, so its plan (and any early-out
    /// variant of it, which only keeps and swaps too) could not be one of
    /// the local search's starts ([`Joint::starts`]). `None`: it runs.
    ///
    /// Why: far below the footprint the swap-only planners' plans are the
    /// slowest seeds, and their time came out of the local search's. On
    /// DenseNet-121 b64 at 12.5% on `v100-16gb-pcie3` (the swap-only bound
    /// 1.217 s, the third family's seed 0.489 s) `swapadvisor` spent 0.78 s
    /// of a 5 s limit, and `odswap`, `window` and `lms` 0.5 s, on plans of
    /// 1.27 s and more; the local search had 1.4 s.
    fn swap_only_skip(
        &self,
        request: &PlanRequest<'_>,
        name: &str,
        planner: &str,
        seeds: &[Seed],
        bound_s: &mut Option<Option<f64>>,
    ) -> Option<Value> {
        if !SWAP_ONLY_SEEDS.contains(&planner) {
            return None;
        }
        let floor_s = nth_family_time_s(seeds, self.improved_seeds)?;
        let bound_s = (*bound_s.get_or_insert_with(|| {
            outcore_bound::swap_only_bound(request.graph, request.cost, request.budget_bytes)
                .time_s()
        }))?;
        // The bound is on the simulator's time; a swap-only seed scored
        // below it by this planner's evaluator would say that the two
        // disagree here, and then nothing is skipped.
        let agrees = seeds
            .iter()
            .filter(|s| SWAP_ONLY_SEEDS.contains(&s.plan.planner.name.as_str()))
            .all(|s| s.iter_time_s >= bound_s * (1.0 - SKIP_MARGIN));
        (agrees && bound_s > floor_s * (1.0 + SKIP_MARGIN)).then(|| {
            json!({
                "planner": name,
                "swap_only_bound_s": bound_s,
                "start_floor_s": floor_s,
                "why": format!(
                    "no plan that only keeps and swaps is faster than {bound_s:.4} s, \
                     and the {} fastest seed families are at {floor_s:.4} s or faster",
                    self.improved_seeds
                ),
            })
        })
    }

    /// Seeds with their offloaded optimizer states turned around
    /// ([`early_out`]): for each of the [`EARLY_OUT_SEEDS`] fastest seeds
    /// (within [`EARLY_OUT_WITHIN`] of the fastest), the states updated
    /// latest turned around, as many as [`early_out_count`] finds fastest,
    /// large parameters kept across the turn and copy-outs started early
    /// where faster ([`early_out_variant`]), and the fastest feasible variant
    /// kept as one more seed, of its origin's family ([`seed_family`]). Run
    /// after the seeds' time, on the local search's: a few evaluations per
    /// seed.
    fn add_early_out_seeds(
        &self,
        request: &PlanRequest<'_>,
        seeds: &mut Vec<Seed>,
        errors: &mut Vec<Value>,
    ) -> Result<(), PlannerError> {
        seeds.sort_by(|a, b| a.iter_time_s.total_cmp(&b.iter_time_s));
        let mut out = SeedSet::default();
        let mut tried = 0;
        let fastest_s = seeds.first().map_or(0.0, |s| s.iter_time_s);
        for seed in seeds.iter() {
            if tried == EARLY_OUT_SEEDS || seed.iter_time_s > fastest_s * EARLY_OUT_WITHIN {
                break;
            }
            let Some(schedule) = seed.plan.lowered_from.as_deref() else {
                continue;
            };
            let (candidates, best) = early_out_variant(request, schedule);
            if candidates == 0 && best.is_none() {
                continue;
            }
            tried += 1;
            if let Some(variant) = best {
                let name = format!(
                    "{EARLY_OUT_PREFIX}{} ({})",
                    seed.name,
                    variant.label(candidates)
                );
                let outcome = prove_seed(request, "early_out", &name, variant.schedule);
                out.record(self.name(), request, name, outcome)?;
            }
        }
        seeds.append(&mut out.seeds);
        errors.append(&mut out.errors);
        Ok(())
    }

    /// `home`'s seeds, in `sub`'s share of the time; returns the part of
    /// the share to hand to the local search rather than to the seeds after
    /// it: all that is left of it where no swarm found a plan, none
    /// otherwise.
    ///
    /// No policy of HOME's fits (known before any search): what its swarm
    /// would have spent goes to the local search, not to the seeds after
    /// it. Where even every feature map off the device leaves too much (the
    /// persistent tensors alone near the budget) `swapadvisor` seldom gives
    /// the fastest seed, and the local search from the others is what moves
    /// the plan. The same where no swarm found a plan.
    fn home_seeds(
        &self,
        sub: &PlanRequest<'_>,
        request: &PlanRequest<'_>,
        out: &mut SeedSet,
    ) -> Result<Duration, PlannerError> {
        let started = Instant::now();
        let planned = match crate::home::below_floor(sub)? {
            Some(why) => {
                let outcome = Ok(PlanOutcome::Infeasible(why));
                out.record(self.name(), request, "home".into(), outcome)?;
                false
            }
            None => self.home_restarts(sub, request, out)?,
        };
        if planned {
            return Ok(Duration::ZERO);
        }
        Ok(Duration::try_from_secs_f64(sub.time_limit_s)
            .unwrap_or_default()
            .saturating_sub(started.elapsed()))
    }

    /// HOME as a seed, restarted with a doubling swarm (IPOP-style) until its
    /// share of the time is spent: the first swarm has `self.home.particles`
    /// particles, each restart twice as many (at most [`HOME_MAX_PARTICLES`])
    /// and the next seed. Every restart's plan is a seed.
    ///
    /// Why: HOME's swarm converges in a number of iterations, and what it
    /// converges to depends on the swarm's size in a way no fixed size gets
    /// right within a second or two, the share it has here. Measured with
    /// `home_study search` (RESULTS.md, "HOME restarts inside `outcore`"): on
    /// BERT-base b32 at 75% on `v100-16gb-pcie3`, 64 particles reach 0.995 of
    /// ideal in 1.2 s and 512 particles 0.882 (one iteration) in the same
    /// time and 0.987 in 5 s; on the PyTorch MobileNet v2 export (same
    /// device) it is the other way round (128 particles 0.934 in 1.2 s, 64
    /// particles 0.922, 512 particles 0.943 in 5 s). Small swarms first give a good plan soon;
    /// larger ones follow as long as time is left. The first swarm gets
    /// [`HOME_FIRST_SHARE`] of the share; whether any swarm found a plan is
    /// returned, so that the caller can hand on what is left where none did.
    /// (Most first swarms converge well within it: three or four restarts
    /// run on ResNet-50 b64 at 50% on `h100-80gb` at `--seconds 5`.)
    fn home_restarts(
        &self,
        sub: &PlanRequest<'_>,
        request: &PlanRequest<'_>,
        out: &mut SeedSet,
    ) -> Result<bool, PlannerError> {
        let started = Instant::now();
        let share = Duration::try_from_secs_f64(sub.time_limit_s.max(0.0)).unwrap_or(Duration::MAX);
        let until = started.checked_add(share).unwrap_or(started);
        let mut particles = self.home.particles.max(1);
        let mut feasible = false;
        for restart in 0..self.home_runs.max(1) as u64 {
            let left_s = until
                .saturating_duration_since(Instant::now())
                .as_secs_f64();
            if restart > 0 && left_s < HOME_MIN_RESTART_S {
                break;
            }
            // The first swarm gets a part of the share: where it finds no
            // plan in that time the rest is handed on (`HOME_FIRST_SHARE`).
            let left_s = if restart == 0 {
                left_s * HOME_FIRST_SHARE
            } else {
                left_s
            };
            let home = crate::Home {
                particles,
                ..self.home
            };
            let run = PlanRequest {
                time_limit_s: left_s,
                seed: sub.seed.wrapping_add(restart),
                ..*sub
            };
            let outcome = home.plan(&run);
            // A plan that fits as it is (no search ran) needs no restart, and
            // an error (a bug of HOME's) would come again. An infeasible
            // swarm is not restarted either: a choice, so that where HOME's
            // policy space has no plan (the tightest budgets) its share goes
            // to `swapadvisor` and the local search rather than to larger
            // swarms of the same space.
            let stop = match &outcome {
                Ok(PlanOutcome::Feasible(plan)) => {
                    feasible = true;
                    plan.planner.settings.get("iterations_run").is_none()
                }
                Ok(PlanOutcome::Infeasible(_)) | Err(_) => true,
            };
            let name = format!("home ({particles} particles, seed +{restart})");
            out.record(self.name(), request, name, outcome)?;
            if stop {
                break;
            }
            particles = (particles * 2).min(HOME_MAX_PARTICLES);
        }
        Ok(feasible)
    }

    /// The eager-update order, when the request plans in the graph's own
    /// order (an order given by the caller is kept) and the two differ.
    fn eager_order(&self, request: &PlanRequest<'_>) -> Option<Vec<OpId>> {
        if !self.eager_seeds {
            return None;
        }
        crate::framework::eager_order_if_other(request)
    }

    /// Where the local search starts: the fastest seeds' schedules, then the
    /// repair starts — every tensor kept, the bound's program
    /// ([`program::program_start`]), and the recomputation seeds planned for
    /// 1.5x the budget — which the search first brings under the budget with
    /// its own moves (a mix of swaps and recomputations none of the seeds
    /// makes). Waits for the program's solve where it is still running
    /// ([`ProgramStart::join`]). The relaxed seeds are planned by
    /// `deadline`, the local search's ([`inner_plan_limit_s`]).
    fn starts(
        &self,
        request: &PlanRequest<'_>,
        seeds: &[Seed],
        program: ProgramStart<'_>,
        deadline: Instant,
    ) -> Vec<Start> {
        // The fastest seeds of distinct planners (or kinds of seed, for
        // those this planner makes itself: [`seed_family`]): a planner's plan in the
        // other order is mostly the same plan, and starting from both would
        // search nearly the same ground twice (on the PyTorch GPT-2 export at
        // 50% the two fastest seeds were `window` in both orders; with this
        // rule the second start is `capuchin`. Both choices ended at 0.395
        // of ideal in 5 s, so this is a choice, not a measured gain).
        let mut out: Vec<Start> = Vec::new();
        for (s, schedule) in family_leaders(seeds).into_iter().take(self.improved_seeds) {
            // The fastest seed's start gets a double share: it is the
            // likeliest to end fastest.
            out.push(Start {
                label: s.name.clone(),
                schedule: schedule.clone(),
                share: if out.is_empty() { 2.0 } else { 1.0 },
            });
        }
        if self.held_starts {
            let held: Vec<Start> = out
                .iter()
                .take(HELD_STARTS)
                .filter_map(|from| {
                    let ctx = Ctx::new(request.graph, request.cost, from.schedule.order.clone());
                    held::held_exchanges(&ctx, &from.schedule).map(|schedule| Start {
                        label: format!("{} + held exchanges", from.label),
                        schedule,
                        share: 1.0,
                    })
                })
                .collect();
            out.extend(held);
        }
        if !self.repair_starts {
            return out;
        }
        out.push(Start {
            label: "keep-all (repaired)".into(),
            schedule: Schedule::in_graph_order(request.graph),
            share: 1.0,
        });
        if let Some(schedule) = program.join(request) {
            out.push(Start {
                label: "the bound's program (repaired)".into(),
                schedule,
                share: PROGRAM_SHARE,
            });
        }
        for name in RELAXED_SEEDS {
            let Ok(planner) = crate::by_name(name) else {
                continue;
            };
            let relaxed = PlanRequest {
                budget_bytes: request
                    .budget_bytes
                    .saturating_add(request.budget_bytes / 2),
                time_limit_s: inner_plan_limit_s(self.bounded_by_counts, deadline),
                ..*request
            };
            if let Ok(PlanOutcome::Feasible(plan)) = planner.plan(&relaxed)
                && let Some(schedule) = plan.lowered_from.as_deref()
            {
                out.push(Start {
                    label: format!("{name} at 1.5x the budget (repaired)"),
                    schedule: schedule.clone(),
                    share: 1.0,
                });
            }
        }
        // The same schedule twice (a relaxed plan that keeps everything) would
        // search the same ground twice.
        let mut unique: Vec<Start> = Vec::with_capacity(out.len());
        for start in out {
            if !unique.iter().any(|u| u.schedule == start.schedule) {
                unique.push(start);
            }
        }
        unique
    }

    /// Improves every start and returns the best plan found: an improved
    /// schedule proven under this planner's name, or the fastest seed's plan
    /// renamed if nothing beat it.
    ///
    /// Two phases: every start gets its share of [`FIRST_PHASE_SHARE`] of the
    /// time left (the fastest seed's start and the bound's program's a double
    /// share), then the fastest schedule reached by a search that had not
    /// converged is searched again with all the time that is left, in turns
    /// with the polish of its swap timing ([`turns`]; module docs, "Time
    /// split").
    fn improve_best(
        &self,
        context: &Context<'_, '_>,
        seeds: Vec<Seed>,
        program: ProgramStart<'_>,
        deadline: Instant,
    ) -> Result<PlanOutcome, PlannerError> {
        let request = context.request;
        let starts = self.starts(request, &seeds, program, deadline);
        let first_until = Instant::now()
            + deadline
                .saturating_duration_since(Instant::now())
                .mul_f64(FIRST_PHASE_SHARE);
        let mut tried = Vec::new();
        let mut reached: Vec<Reached> = Vec::new();
        for (k, start) in starts.iter().enumerate() {
            if check_order(request.graph, &start.schedule.order).is_err() {
                continue;
            }
            let left = first_until.saturating_duration_since(Instant::now());
            let weights_left: f64 = starts[k..].iter().map(|s| s.share).sum();
            let until = Instant::now() + left.mul_f64(start.share / weights_left);
            let ctx = Ctx::new(request.graph, request.cost, start.schedule.order.clone());
            let search = Search::new(&ctx, request, self.name());
            let Some(cost) = start_cost(&search, &start.schedule) else {
                continue;
            };
            let run = self.search_from(&search, start, cost, request.seed, self.limits(until));
            tried.push(run.summary);
            reached.push(run.reached);
        }
        // The second phase: the main search continued and the polish of
        // swap timing, in turns ([`turns`]).
        if let Some((summaries, r)) = self.turns(request, &reached, deadline) {
            tried.extend(summaries);
            reached.push(r);
        }
        if let Some(run) = self.early_out_reached(request, &reached) {
            tried.push(run.summary);
            reached.push(run.reached);
        }
        let best = reached
            .into_iter()
            .filter(|r| r.cost.is_feasible())
            .min_by(|a, b| a.cost.time_s.total_cmp(&b.cost.time_s));
        let fastest = &seeds[0];
        match best {
            Some(r) if r.cost.time_s <= fastest.iter_time_s => {
                let settings = json!({
                    "start": r.label,
                    "bounded_by": self.bounded_by(),
                    "seeds": context.seed_summary,
                    "seed_errors": context.seed_errors,
                    "seeds_skipped": context.seeds_skipped,
                    "local_search": tried,
                });
                prove(self.name(), request, settings, r.schedule, r.cost.time_s)
            }
            _ => Ok(PlanOutcome::Feasible(renamed(
                self.name(),
                (self.bounded_by(), self.bounded_by_counts),
                fastest,
                context,
                tried,
            ))),
        }
    }

    /// What ends the search, as the plan's settings record it: the move
    /// count (the same seed gives the same plan) or the clock.
    fn bounded_by(&self) -> Value {
        if self.bounded_by_counts {
            json!({"moves_per_start": self.max_moves})
        } else {
            json!("time limit")
        }
    }

    /// The main search's limits, until `until`.
    fn limits(&self, until: Instant) -> local::Limits {
        local::Limits {
            deadline: until,
            max_kicks: self.max_kicks,
            max_moves: self.max_moves,
            kinds: self.kinds(),
            prioritised: self.prioritised,
            stagnation: None,
        }
    }

    /// Whether a main search converged: no move improved and every kick
    /// was tried.
    fn search_converged(&self, stats: &local::LocalStats) -> bool {
        stats.converged && stats.kicks >= self.max_kicks
    }

    /// The fastest schedule reached with its offloaded states turned around
    /// ([`early_out_variant`]), where that is faster still: the local search
    /// may end on a schedule whose start had none (a seed not among the
    /// turned ones, or offloads its moves made). A few evaluations after
    /// the deadline.
    fn early_out_reached(&self, request: &PlanRequest<'_>, reached: &[Reached]) -> Option<Run> {
        if !self.early_out_seeds {
            return None;
        }
        let best = fastest_reached(reached)?;
        let (candidates, variant) = early_out_variant(request, &best.schedule);
        let variant = variant?;
        let (time_s, count) = (variant.time_s, variant.count);
        let (kept, early_copies, requeued) = (variant.kept, variant.early_copies, variant.requeued);
        if time_s >= best.cost.time_s {
            return None;
        }
        let label = format!("{} (early-out {})", best.label, variant.label(candidates));
        let schedule = variant.schedule;
        Some(Run {
            summary: json!({
                "start": best.label,
                "start_iter_time_s": best.cost.time_s,
                "iter_time_s": time_s,
                "early_out_states": count,
                "kept_across_iterations": kept,
                "copied_out_early": early_copies,
                "reclaims_requeued": requeued,
            }),
            reached: Reached {
                label,
                schedule,
                cost: Cost::feasible(time_s),
                converged: false,
            },
        })
    }

    /// One local search from `start` (scored `cost`) within `limits`: where
    /// it got, and its summary for the plan's settings.
    fn search_from(
        &self,
        search: &Search<'_, '_>,
        start: &Start,
        cost: Cost,
        seed: u64,
        limits: local::Limits,
    ) -> Run {
        let request = &search.request;
        let (improved, reached, stats) = local::improve(
            search,
            search.ctx,
            request.cost,
            (start.schedule.clone(), cost),
            seed,
            &limits,
        );
        let summary = summary(&start.label, cost, reached, &stats);
        Run {
            summary,
            reached: Reached {
                label: start.label.clone(),
                schedule: improved,
                cost: reached,
                converged: self.search_converged(&stats),
            },
        }
    }
}

/// The first phase's weight of the start from the bound's program (the
/// others' is 1, the fastest seed's 2). With 1, on the PyTorch MobileNet v2
/// export at 50% on `v100-16gb-pcie3` and `--seconds 5`, its search reached
/// 0.907 of ideal in three runs of seven and stopped at 0.770 in the others
/// (the plan was then a seed's, 0.854), 30 to 130 moves short; with 2, in
/// four runs of four (RESULTS.md, issue-16 section, "The bound's program
/// as a start").
const PROGRAM_SHARE: f64 = 2.0;

/// The fastest seeds' starts that also get a start with their chained
/// recomputations traded for held ones ([`held::held_exchanges`]).
const HELD_STARTS: usize = 2;

/// Share of the local search's time that the first phase spreads over every
/// start (see [`Joint::improve_best`]).
const FIRST_PHASE_SHARE: f64 = 0.5;

/// The fastest feasible schedule reached.
fn fastest_reached(reached: &[Reached]) -> Option<&Reached> {
    reached
        .iter()
        .filter(|r| r.cost.is_feasible())
        .min_by(|a, b| a.cost.time_s.total_cmp(&b.cost.time_s))
}

/// A local search's summary for the plan's settings: where it started
/// (`start`, scored `from`), where it got (`to`) and what it did.
fn summary(start: &str, from: Cost, to: Cost, stats: &local::LocalStats) -> Value {
    json!({
        "start": start,
        "start_iter_time_s": from.is_feasible().then_some(from.time_s),
        "start_excess_bytes": from.excess_bytes,
        "iter_time_s": to.is_feasible().then_some(to.time_s),
        "excess_bytes": to.excess_bytes,
        "moves_scored": stats.moves_scored,
        "moves_accepted": stats.moves_accepted,
        "moves_invalid": stats.moves_invalid,
        "moves_infeasible": stats.moves_infeasible,
        "accepted_drop_toswap_torecompute_retime_exchange_repair": stats.accepted_by_kind,
        "converged": stats.converged,
        "repair_given_up": stats.repair_given_up,
        "kicks": stats.kicks,
        "kicks_improved": stats.kicks_improved,
        "stagnant": stats.stagnant,
        // [moves scored, current time, batch mean, batch worst] (s);
        // JSON has no NaN, so a batch with no feasible candidate
        // writes null there.
        "curve": stats.curve_sampled(CURVE_POINTS),
    })
}

/// One local search's result.
struct Run {
    summary: Value,
    reached: Reached,
}

/// Where one local search got.
struct Reached {
    label: String,
    schedule: Schedule,
    cost: Cost,
    converged: bool,
}

/// A seed plan's time under this request's evaluator, when it has a schedule
/// the evaluator can score (every framework planner's plans do); else its own
/// simulated time.
fn seed_time(
    name: &'static str,
    request: &PlanRequest<'_>,
    plan: &Plan,
) -> Result<Option<f64>, PlannerError> {
    let Some(schedule) = &plan.lowered_from else {
        return Ok(plan
            .planner
            .settings
            .get("simulated_iter_time_s")
            .and_then(Value::as_f64));
    };
    let ctx = Ctx::new(request.graph, request.cost, schedule.order.clone());
    let search = Search::new(&ctx, request, name);
    match search.score(schedule, &mut Scratch::default()) {
        Ok(Score::Feasible { iter_time_s, .. }) => Ok(Some(iter_time_s)),
        // A seed scored with margins or its own pool may not score feasible
        // here: its plan still stands, with its own time.
        Ok(_) | Err(_) => Ok(plan
            .planner
            .settings
            .get("simulated_iter_time_s")
            .and_then(Value::as_f64)),
    }
}

/// A schedule the local search starts from.
struct Start {
    label: String,
    schedule: Schedule,
    /// Its weight in the first phase's split of the time (1 by default).
    share: f64,
}

/// Recomputation planners whose plans at 1.5x the budget are repair starts.
const RELAXED_SEEDS: [&str; 2] = ["checkpoint-greedy", "checkpoint-sqrt"];

/// The most time one rule-based plan made inside the search gets on the
/// clock ([`inner_plan_limit_s`]): a second.
pub const INNER_PLAN_LIMIT_S: f64 = 1.0;

/// The time limit of one rule-based plan made inside the search (a
/// streamed merge's recomputation plan, a relaxed repair start) that must
/// be done by `until`.
///
/// On the clock, the time left until `until`, at most
/// [`INNER_PLAN_LIMIT_S`]: they take milliseconds on the suite's graphs, but
/// `dtr` and `checkpoint` skip their candidates past their time limit, so
/// one slow plan must not take a part's whole share, nor run past its end.
/// Bounded by counts (`counted`, [`Joint::bounded_by_moves`]), the time left
/// itself, which is then [`COUNTED_TIME_LIMIT_S`] away: no candidate is
/// skipped for the machine's speed.
pub fn inner_plan_limit_s(counted: bool, until: Instant) -> f64 {
    let left_s = until
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
    if counted {
        left_s
    } else {
        left_s.min(INNER_PLAN_LIMIT_S)
    }
}

/// A start's cost under the evaluator; `None` if it cannot be scored (an
/// order the graph rejects, a lowering error, an allocator failure).
fn start_cost(search: &Search<'_, '_>, schedule: &Schedule) -> Option<Cost> {
    match search.score(schedule, &mut Scratch::default()) {
        Ok(Score::Feasible { iter_time_s, .. }) => Some(Cost::feasible(iter_time_s)),
        Ok(Score::OverBudget { needed_bytes, .. }) => Some(Cost {
            excess_bytes: needed_bytes
                .saturating_sub(search.request.budget_bytes)
                .max(1),
            time_s: f64::INFINITY,
        }),
        Ok(_) | Err(_) => None,
    }
}

/// Proves an improved schedule under this planner's name.
fn prove(
    name: &'static str,
    request: &PlanRequest<'_>,
    settings: Value,
    schedule: Schedule,
    time_s: f64,
) -> Result<PlanOutcome, PlannerError> {
    let ctx = Ctx::new(request.graph, request.cost, schedule.order.clone());
    let search = Search::new(&ctx, request, name);
    let score = search.score(&schedule, &mut Scratch::default())?;
    if !matches!(score, Score::Feasible { .. }) {
        return Err(PlannerError::new(
            name,
            PlannerErrorKind::Verification,
            format!("the improved schedule ({time_s:.6} s) no longer scores feasible"),
        ));
    }
    search.prove(
        Scored {
            settings,
            schedule: Some(schedule),
            score,
        },
        &[],
    )
}

/// The fastest seed's plan under this planner's name, its settings kept;
/// bounded by counts (`counted`), without the seed's wall-clock times
/// ([`WALL_TIME_KEYS`]), so that the same seed writes the same plan file.
fn renamed(
    name: &'static str,
    (bounded_by, counted): (Value, bool),
    seed: &Seed,
    context: &Context<'_, '_>,
    tried: Vec<Value>,
) -> Box<Plan> {
    let mut plan = seed.plan.clone();
    plan.planner.name = name.into();
    let mut seed_settings = seed.plan.planner.settings.clone();
    if counted {
        drop_wall_times(&mut seed_settings);
    }
    plan.planner.settings = json!({
        "seed": seed.name,
        "bounded_by": bounded_by,
        "seed_settings": seed_settings,
        "seeds": context.seed_summary,
        "seed_errors": context.seed_errors,
        "seeds_skipped": context.seeds_skipped,
        "local_search": tried,
        "note": "no local search improved on the fastest seed",
    });
    plan
}

/// The keys under which seeds record wall-clock seconds in their settings:
/// HOME's search time and each SwapAdvisor generation's `elapsed_s`.
const WALL_TIME_KEYS: [&str; 2] = ["search_s", "elapsed_s"];

/// Removes every [`WALL_TIME_KEYS`] entry from `settings`, at any depth.
fn drop_wall_times(settings: &mut Value) {
    match settings {
        Value::Object(map) => {
            for key in WALL_TIME_KEYS {
                map.remove(key);
            }
            map.values_mut().for_each(drop_wall_times);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_wall_times),
        _ => {}
    }
}

/// Why no seed found a plan: the seed's reason that needs the fewest bytes;
/// among those that name no byte count, one that says what failed before
/// one that had nothing to try (on tiny-cnn at 150% under `best-fit`, every
/// seed failed and the first, `checkpoint-all`'s "no candidate plan to
/// try", was all the user read, where `none`'s said which segment did not fit).
fn no_seed(request: &PlanRequest<'_>, infeasible: Vec<Infeasible>) -> Infeasible {
    let closest = infeasible.into_iter().min_by_key(|i| {
        (
            i.needed_bytes.unwrap_or(u64::MAX),
            i.kind == InfeasibleKind::NoCandidate,
        )
    });
    match closest {
        Some(mut why) => {
            why.message = format!("no planner found a plan; the closest: {}", why.message);
            why
        }
        None => Infeasible {
            kind: InfeasibleKind::NoCandidate,
            needed_bytes: None,
            budget_bytes: request.budget_bytes,
            at: None,
            message: "no planner found a plan, and none said how close it came".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{Job, Joint, MergeBudget, Score, Verdict, early_out_count, no_seed, seeds_time};
    use outcore_plan::{Infeasible, InfeasibleKind};
    use std::time::{Duration, Instant};

    /// The reason shown when no seed plans: fewest bytes first, then one
    /// that says what failed before one that had nothing to try.
    #[test]
    fn no_seed_shows_a_reason_that_says_what_failed() {
        let graph =
            outcore_graph::zoo::build("mlp", Some(4), &Default::default(), None).expect("mlp");
        let cost = outcore_cost::RooflineModel::new(
            outcore_cost::DeviceProfile::builtin("v100-16gb-pcie3").expect("built in"),
        );
        let request = outcore_plan::PlanRequest {
            graph: &graph,
            cost: &cost,
            budget_bytes: 1000,
            seed: 0,
            time_limit_s: 1.0,
            allocator: &outcore_plan::AllocatorSpec::Perfect,
            order: None,
            fingerprint: None,
        };
        let why = |kind, needed_bytes, message: &str| Infeasible {
            kind,
            needed_bytes,
            budget_bytes: 1000,
            at: None,
            message: message.into(),
        };
        let nothing = why(
            InfeasibleKind::NoCandidate,
            None,
            "a: no candidate plan to try",
        );
        let failed = why(
            InfeasibleKind::AllocatorFailure,
            None,
            "b: the segment does not fit",
        );
        let shown = no_seed(&request, vec![nothing.clone(), failed.clone()]);
        assert!(
            shown
                .message
                .ends_with("the closest: b: the segment does not fit"),
            "{}",
            shown.message
        );
        let short = why(InfeasibleKind::OverBudget, Some(1200), "c: needs 1200 B");
        let shown = no_seed(&request, vec![nothing, failed, short]);
        assert!(
            shown.message.ends_with("c: needs 1200 B"),
            "{}",
            shown.message
        );
    }

    /// A seed's wall-clock times go, at any depth; everything else stays.
    #[test]
    fn wall_times_are_dropped_at_any_depth() {
        let mut settings = serde_json::json!({
            "search_s": 1.5,
            "particles": 20,
            "history": [{"generation": 1, "elapsed_s": 0.25, "best_s": 0.047}],
        });
        super::drop_wall_times(&mut settings);
        assert_eq!(
            settings,
            serde_json::json!({
                "particles": 20,
                "history": [{"generation": 1, "best_s": 0.047}],
            })
        );
    }

    /// A search bounded by counts runs as if it had
    /// [`super::COUNTED_TIME_LIMIT_S`]: its deadline and its seeds' part of
    /// it must be `Instant`s past anything a run reaches (a deadline that
    /// overflowed would fall back to now and end the search at once).
    #[test]
    fn the_counted_time_limit_gives_deadlines_years_away() {
        let total = Duration::try_from_secs_f64(super::COUNTED_TIME_LIMIT_S).expect("in range");
        let now = Instant::now();
        let year = Duration::from_secs(365 * 24 * 3600);
        let deadline = now.checked_add(total).expect("a deadline, not an overflow");
        assert!(deadline.duration_since(now) > 1000 * year);
        let seeds_until = now.checked_add(seeds_time(total)).expect("seeds' deadline");
        assert!(seeds_until.duration_since(now) > 100 * year);
    }

    /// An inner plan's limit on the clock is the time left, capped at a
    /// second, and never past its part's end (a part already over gets
    /// none); bounded by counts it is the time left, uncapped.
    #[test]
    fn inner_plans_get_at_most_a_second_on_the_clock_and_never_past_the_end() {
        use super::{INNER_PLAN_LIMIT_S, inner_plan_limit_s};
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        assert_eq!(inner_plan_limit_s(false, far), INNER_PLAN_LIMIT_S);
        assert!(inner_plan_limit_s(true, far) > 3599.0);
        let soon = now + Duration::from_millis(200);
        let left_s = inner_plan_limit_s(false, soon);
        assert!(left_s > 0.0 && left_s <= 0.2, "{left_s}");
        assert_eq!(inner_plan_limit_s(false, now), 0.0);
        assert_eq!(inner_plan_limit_s(true, now), 0.0);
    }

    /// `tensile` runs after every streamed and mixed seed and before the
    /// swap-only seeds and the searches ([`super::LATE_SEEDS`]), in the
    /// request's order only (it is not an eager-order seed).
    #[test]
    fn tensile_runs_after_the_streamed_and_mixed_seeds() {
        let joint = Joint::default();
        let planners = joint.seed_planners();
        let eager: Vec<outcore_graph::OpId> = Vec::new();
        let jobs = joint.seed_jobs(None, &planners, Some(&eager));
        let name = |j: &Job<'_>| match j {
            Job::Planner(p, _) | Job::SwapOnly(p, _) => p.name(),
            _ => "",
        };
        let at: Vec<usize> = (0..jobs.len())
            .filter(|&i| name(&jobs[i]) == "tensile")
            .collect();
        assert_eq!(at.len(), 1, "one tensile job");
        let tensile = at[0];
        let last_streamed_or_mixed = (0..jobs.len())
            .filter(|&i| matches!(jobs[i], Job::Streamed(_) | Job::Mixed(_)))
            .max()
            .expect("streamed and mixed seeds are on by default");
        let first_swap_only = (0..jobs.len())
            .find(|&i| matches!(jobs[i], Job::SwapOnly(..)))
            .expect("swap-only seeds");
        assert!(last_streamed_or_mixed < tensile && tensile < first_swap_only);
    }

    /// A request of 1000 bytes: a merge needing 1300 lowers the next budget
    /// by the 300 over (1000 -> 700); one needing 1001 by the 0.5% floor
    /// (700 -> 695); no plan at 695 halves towards the last over budget
    /// (695 + (700 - 695) / 2 = 697); a fit is the one; anything else stops;
    /// and the bisection ends once the next budget reaches one without a
    /// plan.
    #[test]
    fn merge_rounds_lower_the_budget_by_the_excess_and_bisect_after_no_plan() {
        let over = |needed_bytes| {
            Ok(Score::OverBudget {
                needed_bytes,
                at_step: None,
            })
        };
        let mut budget = MergeBudget::new(1000);
        assert_eq!(budget.next(), Some(1000));
        assert_eq!(budget.judge(over(1300), 1000), Verdict::Lower);
        assert_eq!(budget.next(), Some(700));
        assert_eq!(budget.judge(over(1001), 1000), Verdict::Lower);
        assert_eq!(budget.next(), Some(695));
        budget.no_plan();
        assert_eq!(budget.next(), Some(697));
        assert_eq!(budget.judge(Ok(Score::Skipped), 1000), Verdict::Stop);
        let fits = Score::Feasible {
            iter_time_s: 0.5,
            throughput_vs_ideal: 0.8,
            peak_bytes: 990,
            allocator: outcore_plan::AllocatorSpec::Perfect,
        };
        assert_eq!(
            budget.judge(Ok(fits), 1000),
            Verdict::Fits { iter_time_s: 0.5 }
        );
        // 697 over by 5 -> 692 <= 695 (no plan): halve to 695 + 1 = 696,
        // then again: 696 over -> 691, halve to 695 + 0 = 695 = no plan: done.
        assert_eq!(budget.judge(over(1005), 1000), Verdict::Lower);
        assert_eq!(budget.next(), Some(696));
        budget.judge(over(1005), 1000);
        assert_eq!(budget.next(), None);
    }

    /// Powers of two up to `n`, `n`, then the midpoints beside the fastest:
    /// with the fastest count at 44 of 296 (times falling to it, rising
    /// after, none feasible above 100), the sweep scores 1, 2, ..., 64, 128,
    /// stops after 64 and 128 (farther, then infeasible), and tries 24 and 48
    /// beside 32, of which 48 is nearer 44.
    #[test]
    fn the_count_sweep_finds_the_fastest_power_of_two_and_refines_beside_it() {
        let mut scored = Vec::new();
        let mut score = |count: usize| {
            scored.push(count);
            (count <= 100).then(|| ((count as f64 - 44.0).abs(), count, ()))
        };
        let best = early_out_count(296, &mut score).expect("feasible counts");
        assert_eq!(best.1, 48);
        assert_eq!(scored, [1, 2, 4, 8, 16, 32, 64, 128, 24, 48]);
        // None feasible: none kept.
        assert!(early_out_count(5, &mut |_| None::<(f64, usize, ())>).is_none());
        // One candidate: one count.
        let mut one = Vec::new();
        let best = early_out_count(1, &mut |c| {
            one.push(c);
            Some((1.0, c, ()))
        });
        assert_eq!((best.map(|b| b.1), one), (Some(1), vec![1]));
    }

    /// 70% of the first 5 s, 20% of the rest: 5 s limits split as before
    /// the cap (3.5 s for the seeds), a minute gives them 3.5 + 11 s.
    #[test]
    fn the_seeds_get_most_of_five_seconds_and_a_fifth_of_the_rest() {
        let seeds_s = |total_s: f64| seeds_time(Duration::from_secs_f64(total_s)).as_secs_f64();
        assert!((seeds_s(2.0) - 1.4).abs() < 1e-9);
        assert!((seeds_s(5.0) - 3.5).abs() < 1e-9);
        assert!((seeds_s(60.0) - 14.5).abs() < 1e-9);
        assert_eq!(seeds_s(0.0), 0.0);
    }
}
