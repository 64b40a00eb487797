//! Local search on one schedule: batches of moves scored in parallel, the best
//! improving one taken, until no move improves or the time is spent.
//!
//! Choices, and why:
//! - Best-of-batch rather than first-improvement: a batch of [`BATCH`] moves is
//!   scored in parallel (rayon) and the fastest feasible one below the current
//!   time is taken, ties to the lower index. The batch size is fixed, not the
//!   thread count, so the same seed takes the same moves on any machine that
//!   scores the same number of batches (a search cut by the time limit stops
//!   at a machine-dependent point; with `time_limit_s` large enough to finish,
//!   the plan depends on the seed alone).
//! - After the batch's best is taken, the batch's other improving moves are
//!   made on top of it one by one, best first, each kept where it still
//!   improves (`Step::chain`): one accepted move per batch of 32 left the
//!   prioritised moves (below) scored again and again. Measured (`outcore
//!   bench-suite --planners outcore --seconds 5`, 2026-11-28, 2-core VM):
//!   5 of 96 cases up by more than 0.003 of ideal (DenseNet-121 at 25% on
//!   `h100-80gb` 0.756 to 0.764; the PyTorch ResNet-50 at 25% there 0.831
//!   to 0.841, but two runs alone gave 0.831 with either build), one down
//!   (the PyTorch VGG-16 at 50% on `v100-16gb-pcie3`, 0.912 to 0.904, a
//!   case that reads either with any build).
//! - The polish ([`polish`]) first starts every stalled swap-in earlier at
//!   once, by each of [`LEADS`] (`Step::lead`), while that improves: one
//!   retime per move left most of a stall-bound plan's swap-ins late. On
//!   GPT-2 b8 at 25% (5 s) `outcore` went from 0.4896 s to 0.4773 s an
//!   iteration on `v100-16gb-pcie3` and from 0.1235 s to 0.1182 s on
//!   `h100-80gb` (0.746 / 0.741 to 0.765 / 0.774 of ideal); RESULTS.md,
//!   issue-16 section, for the suite. Each lead is also offered held to
//!   the budget ([`super::moves::fitted_swap_ins`]: each swap-in only as
//!   far back as the resident bytes leave it room): on the PyTorch GPT-2
//!   export at 25% every plain lead is over the budget at the LM head,
//!   and the fitted ones took the fastest seed from 0.3413 s to 0.3314 s.
//!   A fitted lead that `verify` still finds over the budget is made again
//!   without the swap-in it is over at, or the largest one led across the
//!   op it is over at (`Step::held_back_where_over`): on the same graph on
//!   `h100-80gb` every fitted lead was over at the token embedding's
//!   weight, so no stalled swap-in was led. With it the plan at 20 s went
//!   from 0.0498 s to 0.0480-0.0487 s there and from 0.2127 s to
//!   0.2067-0.2074 s on `v100-16gb-pcie3` (RESULTS.md, issue-16 section,
//!   for the suite).
//! - The moves are shuffled by the seeded generator after every accepted move:
//!   gap indices change when a gap is dropped, and a fixed order would spend
//!   every round on the first tensors of the graph.
//! - Within a round, the moves that end a recomputation come first, the
//!   dearest recomputation first (`prioritise`; shuffled among equals,
//!   the others after them as shuffled): a time-limited search on a large
//!   graph scores a few thousand moves, and at random most batches held no
//!   improving move. Not while the schedule is over the budget, where every
//!   such move costs memory. Measured with the swap timing of
//!   `super::moves::placed_swap` (RESULTS.md, issue-16 section, "Swaps
//!   placed on the idle link").
//! - The deadline is checked before each candidate of a batch, not only
//!   between batches: the candidates past it are not scored (nor counted),
//!   and the best of those scored is taken as usual. A start whose
//!   schedules are dear to score would otherwise overrun its share by a
//!   whole batch and take the time of the starts after it: on GPT-2 b8 at
//!   25% on `v100-16gb-pcie3`, the bound's program's start priced at a
//!   hundredth of the link had 29,307 gaps (815 ops), a candidate took 30
//!   to 60 ms to score, and its first batch of 32 took 0.86 s against a
//!   0.08 s share, leaving the fastest seed's continued search none of its
//!   0.5 s. Under a move limit alone (a deadline far away) nothing changes,
//!   so the same seed still gives the same plan.
//! - Only feasible schedules are accepted (the start is feasible), so the
//!   search never leaves the feasible region; [`super::moves::Move::Exchange`]
//!   is what lets it trade memory between tensors without passing through an
//!   infeasible schedule.
//! - An improvement must be larger than [`MIN_GAIN`] of the current time: the
//!   simulator is deterministic, but a round per 0.01% is time better spent
//!   on kicks.
//! - Candidates are simulated before they are verified, and those no faster
//!   than the current schedule (by [`MIN_GAIN`]) are not verified at all
//!   (`Outcome::Slower`, [`Search::score_unless_slower`]), where the current
//!   schedule is within the budget (over it, a slower candidate with fewer
//!   excess bytes is taken). The climb takes the same moves as with every
//!   candidate verified (a screened one would not have been taken), so a
//!   search limited by moves gives the same plan; one limited by time
//!   scores more of them. On BERT-base b32 at 12.5% on `h100-80gb` (5 s)
//!   the first two feasible starts scored 871 / 808 moves instead of 547 /
//!   416, and the second phase 3,436 instead of 2,190. The kicks are not
//!   screened: they take any feasible move. More moves is not always a
//!   better end: GPT-2 b8 at 25% on `h100-80gb` fell from 0.807 to 0.797
//!   of ideal (another local optimum; RESULTS.md, "Candidates screened by
//!   their simulated time").
//! - Iterated local search: at a local optimum the best schedule is kicked by
//!   a few random feasible moves and climbed again; a kick's optimum replaces
//!   the best only if faster. Measured on ResNet-50 b256 at 50% of its
//!   footprint on `v100-16gb-pcie3`: see RESULTS.md.

use super::moves::{Kinds, Move, Neighbourhood, apply};
use crate::framework::{Ctx, PeakAt, Score, Scratch, Screen, Search};
use outcore_cost::CostModel;
use outcore_graph::TensorId;
use outcore_plan::{Restore, Schedule};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::time::Instant;

/// Moves scored per parallel batch.
pub const BATCH: usize = 32;
/// Least relative gain a move must bring.
pub const MIN_GAIN: f64 = 1e-4;

/// What a local search did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalStats {
    pub moves_scored: usize,
    pub moves_accepted: usize,
    /// Moves whose schedule the lowering or the verifier refused (a
    /// recomputation chain broken by the move).
    pub moves_invalid: usize,
    /// Moves feasible in bytes but over the budget or refused by the allocator.
    pub moves_infeasible: usize,
    /// Accepted moves by kind: drop, to-swap, to-recompute, retime,
    /// exchange, repair (add swap or recompute).
    pub accepted_by_kind: [usize; 6],
    /// The last climb stopped because no move improved (else: the time limit).
    pub converged: bool,
    /// The repair of a start over the budget was given up as too slow to
    /// reach the budget in its time (`RepairPace`).
    pub repair_given_up: bool,
    /// Kicks (iterated local search restarts) tried, and those that led to a
    /// better schedule.
    pub kicks: usize,
    pub kicks_improved: usize,
    /// The search stopped because it had stagnated ([`Limits::stagnation`]).
    pub stagnant: bool,
    /// The time the search last gained [`Stagnation::gain`] below, and the
    /// moves scored then (where a stagnation limit is set and a feasible
    /// schedule has been seen).
    pub since_gain: Option<(f64, usize)>,
    /// One point per scored batch of a climb: moves scored so far, then the
    /// iteration time of the climb's current schedule and the mean and worst
    /// of the batch's feasible candidates (`NaN` where none was feasible).
    pub curve: Vec<[f64; 4]>,
}

impl LocalStats {
    /// At most `points` of the curve, evenly spaced, the first and last kept.
    pub fn curve_sampled(&self, points: usize) -> Vec<[f64; 4]> {
        let n = self.curve.len();
        if n <= points || points < 2 {
            return self.curve.clone();
        }
        (0..points)
            .map(|i| self.curve[i * (n - 1) / (points - 1)])
            .collect()
    }
}

/// [`LocalStats::accepted_by_kind`]'s index of the retimes.
const RETIME_KIND: usize = 3;

fn kind_index(m: Move) -> usize {
    match m {
        Move::Drop { .. } => 0,
        Move::ToSwap { .. } => 1,
        Move::ToRecompute { .. } => 2,
        Move::Retime { .. } => RETIME_KIND,
        Move::Exchange { .. }
        | Move::ExchangeOffload { .. }
        | Move::SwapAndOffload { .. }
        | Move::ExchangeRecompute { .. } => 4,
        Move::AddSwap { .. } | Move::AddRecompute { .. } | Move::AddOffload { .. } => 5,
    }
}

/// What scoring one move came to.
enum Outcome {
    Feasible(f64, Schedule),
    /// Simulated no faster than the schedule it must beat, and so neither
    /// verified nor kept ([`Search::score_unless_slower`]).
    Slower(f64),
    /// Verified but over the budget: the bytes it needs, and the schedule.
    OverBudget(u64, Schedule),
    /// Refused by the allocator, or not scored.
    Infeasible,
    Invalid,
    /// Not scored: the deadline had passed (module docs).
    Late,
}

/// The search's objective: over-budget bytes first, then time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub excess_bytes: u64,
    pub time_s: f64,
}

impl Cost {
    pub fn feasible(time_s: f64) -> Cost {
        Cost {
            excess_bytes: 0,
            time_s,
        }
    }

    /// Whether `self` beats `other` by more than [`MIN_GAIN`] in time (any
    /// fewer excess bytes count).
    pub fn beats(&self, other: &Cost) -> bool {
        if self.excess_bytes != other.excess_bytes {
            return self.excess_bytes < other.excess_bytes;
        }
        self.excess_bytes == 0 && self.time_s < other.time_s * (1.0 - MIN_GAIN)
    }

    pub fn is_feasible(&self) -> bool {
        self.excess_bytes == 0
    }

    /// The simulated time from which no schedule [`Cost::beats`] this one
    /// whatever its memory, where this one is within the budget (over it,
    /// a schedule with fewer excess bytes beats it at any time).
    fn slower_from_s(&self) -> Option<f64> {
        self.is_feasible().then_some(self.time_s * (1.0 - MIN_GAIN))
    }
}

/// Improves `start` (of cost `start_cost`; over the budget, it is repaired
/// first) until `deadline`: climbs to a local optimum, then, while time is
/// left, kicks the best schedule with [`KICK_MOVES`] random feasible moves
/// and climbs again (iterated local search); returns the best schedule, its
/// cost and what the search did.
pub fn improve(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    start: (Schedule, Cost),
    seed: u64,
    limits: &Limits,
) -> (Schedule, Cost, LocalStats) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut stats = LocalStats::default();
    limits.note_progress(&mut stats, start.1);
    let climbed = climb(search, ctx, cost, start, &mut rng, limits, &mut stats);
    let (mut best, mut best_cost) = climbed;
    while best_cost.is_feasible() && !limits.reached(&stats) && stats.kicks < limits.max_kicks {
        stats.kicks += 1;
        let Some(kicked) = kick(search, ctx, cost, &best, limits, &mut rng, &mut stats) else {
            continue;
        };
        let (next, next_cost) = climb(search, ctx, cost, kicked, &mut rng, limits, &mut stats);
        if next_cost.beats(&best_cost) {
            best = next;
            best_cost = next_cost;
            stats.kicks_improved += 1;
        }
    }
    stats.stagnant = limits.stagnated(&stats);
    (best, best_cost, stats)
}

/// When a search stops, besides converging.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub deadline: Instant,
    pub max_kicks: usize,
    pub max_moves: usize,
    /// The moves offered (and so what kind of plan the search stays within).
    pub kinds: Kinds,
    /// Score first the moves that end the dearest recomputations
    /// (`prioritise`); else in the shuffled order alone.
    pub prioritised: bool,
    /// Stop when the search has stagnated; `None`: only at the deadline,
    /// the move limit or convergence.
    pub stagnation: Option<Stagnation>,
}

/// A search has stagnated when it has scored `moves` moves since its
/// fastest feasible schedule last fell by `gain` (relative) or more.
/// Counted in moves, not seconds, so that a search under move bounds alone
/// stays reproducible.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stagnation {
    pub moves: usize,
    pub gain: f64,
}

impl Limits {
    fn reached(&self, stats: &LocalStats) -> bool {
        stats.moves_scored >= self.max_moves
            || Instant::now() >= self.deadline
            || self.stagnated(stats)
    }

    fn stagnated(&self, stats: &LocalStats) -> bool {
        match (self.stagnation, stats.since_gain) {
            (Some(st), Some((_, at))) => stats.moves_scored.saturating_sub(at) >= st.moves,
            _ => false,
        }
    }

    /// Notes that the search reached `cost`: where it is feasible and
    /// [`Stagnation::gain`] faster than the last such, it restarts the count.
    fn note_progress(&self, stats: &mut LocalStats, cost: Cost) {
        let Some(st) = self.stagnation else {
            return;
        };
        if !cost.is_feasible() {
            return;
        }
        let gained = match stats.since_gain {
            Some((time_s, _)) => cost.time_s <= time_s * (1.0 - st.gain),
            None => true,
        };
        if gained {
            stats.since_gain = Some((cost.time_s, stats.moves_scored));
        }
    }
}

/// How fast a climb over the budget sheds its excess, judged at each
/// [`PACE_CHECKS`]th of its time: where the bytes shed since the last
/// check, kept up at that rate for twice the time left, would still leave
/// some over the budget, the repair is given up and its time goes to the
/// starts after it (and from the last to the second phase).
///
/// Why: the repair starts (every tensor kept, the bound's program, the
/// recomputation seeds at 1.5x the budget) are where the seeds' rules miss
/// a mix, but far below a graph's footprint they take their whole share
/// and end over the budget, which gives nothing. On BERT-base b32 at 12.5%
/// on `v100-16gb-pcie3` (5 s) the bound's program's start shed 0.19 of its
/// 1.69 GB excess in the first quarter of its 0.51 s and 0.04 GB in the
/// rest; keep-all's shed 3.1 of 4.0 GB, a fifteenth of it in its last
/// quarter. Judged from the last check rather than from the start, since a
/// repair sheds most at first (its first moves take the largest tensors
/// off). The factor 2 leaves room for a repair whose pace picks up again.
#[derive(Debug, Clone, Copy)]
struct RepairPace {
    started: Instant,
    span_s: f64,
    /// The last check passed: its index (0 at the start) and excess then.
    last: (u32, u64),
}

/// Checks of [`RepairPace`] per climb, the first two only recording.
const PACE_CHECKS: u32 = 8;

impl RepairPace {
    fn new(deadline: Instant, excess_bytes: u64) -> Self {
        let started = Instant::now();
        RepairPace {
            started,
            span_s: deadline.saturating_duration_since(started).as_secs_f64(),
            last: (0, excess_bytes),
        }
    }

    /// Whether the repair, now `excess_bytes` over, is too slow to finish.
    fn hopeless(&mut self, excess_bytes: u64) -> bool {
        let elapsed_s = self.started.elapsed().as_secs_f64();
        self.hopeless_at(elapsed_s, excess_bytes)
    }

    /// [`RepairPace::hopeless`] `elapsed_s` into the climb.
    fn hopeless_at(&mut self, elapsed_s: f64, excess_bytes: u64) -> bool {
        if self.span_s <= 0.0 {
            return false;
        }
        let check = (elapsed_s / self.span_s * f64::from(PACE_CHECKS)).floor() as u32;
        let (last_check, last_excess) = self.last;
        if check <= last_check {
            return false;
        }
        self.last = (check, excess_bytes);
        if check < 2 {
            return false;
        }
        let period_s = f64::from(check - last_check) * self.span_s / f64::from(PACE_CHECKS);
        let shed_per_s = last_excess.saturating_sub(excess_bytes) as f64 / period_s;
        let left_s = (self.span_s - elapsed_s).max(0.0);
        2.0 * shed_per_s * left_s < excess_bytes as f64
    }
}

/// Random moves applied to a local optimum to leave its basin.
pub const KICK_MOVES: usize = 3;
/// Kicks after the first local optimum, at most.
pub const MAX_KICKS: usize = 64;

/// Climbs from `start` (feasible) over the triggers of the swap-ins that
/// compute waits for ([`Kinds::SwapTiming`], offered only for the swap-ins
/// [`Search::stalled_swap_ins`] names, found again after every accepted
/// move) until no retime improves, `max_moves` are scored or `deadline`;
/// no kicks.
///
/// Why a neighbourhood of its own: a swap-in's time is not monotone in its
/// trigger (see [`super::moves::RETIME_NEAR`]), so it takes a dense set of
/// triggers per swap-in; offered among the main moves for every swap-in
/// they would crowd out the moves that trade recomputations for swaps
/// (offloads' retimes in the main neighbourhood: -0.3 to +0.1 points of
/// ideal on the transformers, RESULTS.md), and where nothing waits they
/// can change no time. Run at each local optimum of the main search
/// instead (tried), it sent the PyTorch VGG-16 export at 50% on
/// `h100-80gb` to 0.902 of ideal from 0.906: the retimes it accepts early
/// steer the main search's later moves elsewhere.
pub fn polish(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    start: (Schedule, Cost),
    seed: u64,
    (deadline, max_moves): (Instant, usize),
) -> (Schedule, Cost, LocalStats) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut stats = LocalStats::default();
    let limits = Limits {
        deadline,
        max_kicks: 0,
        max_moves,
        kinds: Kinds::SwapTiming,
        prioritised: false,
        stagnation: None,
    };
    let (schedule, reached) = climb(search, ctx, cost, start, &mut rng, &limits, &mut stats);
    (schedule, reached, stats)
}

/// Hill-climbs from `start` to a local optimum (or the deadline). Over the
/// budget, the repair moves join the neighbourhood.
fn climb(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    start: (Schedule, Cost),
    rng: &mut ChaCha8Rng,
    limits: &Limits,
    stats: &mut LocalStats,
) -> (Schedule, Cost) {
    let (mut current, mut current_cost) = start;
    let mut pace = RepairPace::new(limits.deadline, current_cost.excess_bytes);
    let mut moves = Vec::new();
    let mut repairs = Vec::new();
    // Whether the stalled swap-ins are still started earlier all at once
    // before the single retimes (until that first fails).
    let mut leading = true;
    'rounds: loop {
        if limits.kinds == Kinds::SwapTiming {
            // Only where compute waits ([`polish`]).
            let stalled = search.stalled_swap_ins(&current);
            if leading && current_cost.is_feasible() && !limits.reached(stats) {
                let step = Step {
                    search,
                    ctx,
                    cost,
                    limits,
                };
                match step.lead(&current, &stalled, current_cost, stats) {
                    Some((led, led_cost)) => {
                        current = led;
                        current_cost = led_cost;
                        stats.moves_accepted += 1;
                        stats.accepted_by_kind[RETIME_KIND] += 1;
                        continue 'rounds;
                    }
                    None => leading = false,
                }
            }
            Neighbourhood::retimes(&current, Some(&stalled), &mut moves);
        } else {
            let hood = Neighbourhood::of(ctx, &current, limits.kinds);
            hood.moves(ctx, &current, &mut moves);
            if !current_cost.is_feasible() {
                hood.repairs(ctx, &current, &mut repairs);
                moves.append(&mut repairs);
            }
        }
        moves.shuffle(rng);
        // Over the budget the repair moves come first as shuffled: the
        // prioritised moves all cost memory.
        if limits.prioritised && current_cost.is_feasible() {
            prioritise(ctx, &current, &mut moves);
        }
        for batch in moves.chunks(BATCH) {
            if limits.reached(stats) {
                break 'rounds;
            }
            if !current_cost.is_feasible() && pace.hopeless(current_cost.excess_bytes) {
                stats.repair_given_up = true;
                break 'rounds;
            }
            let outcomes = score_batch(
                search,
                ctx,
                cost,
                (&current, current_cost.slower_from_s()),
                batch,
                limits.deadline,
            );
            stats.moves_scored += scored(&outcomes);
            let Judged {
                best,
                mut improving,
            } = judge(&outcomes, current_cost, search.request.budget_bytes, stats);
            let after = best.map_or(current_cost, |(_, c)| c);
            record_batch(stats, &outcomes, after);
            limits.note_progress(stats, after);
            let Some((i, c)) = best else {
                continue;
            };
            if let Some(Outcome::Feasible(_, schedule) | Outcome::OverBudget(_, schedule)) =
                outcomes.into_iter().nth(i)
            {
                let before = std::mem::replace(&mut current, schedule);
                current_cost = c;
                stats.moves_accepted += 1;
                stats.accepted_by_kind[kind_index(batch[i])] += 1;
                if current_cost.is_feasible() {
                    improving.retain(|&(j, _)| j != i);
                    improving.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                    let rest: Vec<Move> = improving.iter().map(|&(j, _)| batch[j]).collect();
                    let step = Step {
                        search,
                        ctx,
                        cost,
                        limits,
                    };
                    step.chain(&before, &rest, (&mut current, &mut current_cost), stats);
                }
                continue 'rounds;
            }
        }
        stats.converged = true;
        break;
    }
    (current, current_cost)
}

/// A batch's outcomes against the current cost: the best that beats it
/// (the first of equals), and every feasible one that beats it with its
/// time (the rest of the batch [`Step::chain`] tries after the best).
/// Counts the infeasible and invalid moves in `stats`.
fn judge(
    outcomes: &[Outcome],
    current_cost: Cost,
    budget_bytes: u64,
    stats: &mut LocalStats,
) -> Judged {
    let mut best: Option<(usize, Cost)> = None;
    let mut improving: Vec<(usize, f64)> = Vec::new();
    for (i, o) in outcomes.iter().enumerate() {
        let c = match o {
            Outcome::Feasible(t, _) => Cost::feasible(*t),
            Outcome::OverBudget(needed, _) => Cost {
                excess_bytes: needed.saturating_sub(budget_bytes).max(1),
                time_s: f64::INFINITY,
            },
            Outcome::Infeasible => {
                stats.moves_infeasible += 1;
                continue;
            }
            Outcome::Invalid => {
                stats.moves_invalid += 1;
                continue;
            }
            Outcome::Late | Outcome::Slower(_) => continue,
        };
        if c.beats(&current_cost) {
            if c.is_feasible() {
                improving.push((i, c.time_s));
            }
            if best.is_none_or(|(_, b)| c.beats(&b)) {
                best = Some((i, c));
            }
        }
    }
    Judged { best, improving }
}

/// What [`judge`] finds in a batch.
struct Judged {
    /// The index and cost of the best move that beats the current cost.
    best: Option<(usize, Cost)>,
    /// Every feasible move that beats it, with its time.
    improving: Vec<(usize, f64)>,
}

/// What scoring one more move on the climb's schedule needs.
struct Step<'a, 's, 'r> {
    search: &'a Search<'s, 'r>,
    ctx: &'a Ctx<'r>,
    cost: &'a dyn CostModel,
    limits: &'a Limits,
}

/// The leads `Step::lead` tries: each stalled swap-in started where the
/// compute before its use takes this many times its copy.
pub const LEADS: [f64; 6] = [1.5, 2.0, 3.0, 4.0, 6.0, 8.0];

/// Swap-ins a fitted lead leaves out, one at a time, where `verify` finds
/// it over the budget at them (`Step::fitted_lead`): each costs an
/// evaluation.
pub const FITTED_REPAIRS: usize = 3;

impl Step<'_, '_, '_> {
    /// The fastest of `current` with every swap-in in `stalled` started
    /// earlier by each of [`LEADS`] ([`super::moves::led_swap_ins`]),
    /// scored in parallel, where it beats `current_cost`.
    fn lead(
        &self,
        current: &Schedule,
        stalled: &[outcore_graph::TensorId],
        current_cost: Cost,
        stats: &mut LocalStats,
    ) -> Option<(Schedule, Cost)> {
        // Each with its score where the fitted lead already has it.
        let mut candidates: Vec<(Schedule, Option<Scored>)> = Vec::with_capacity(2 * LEADS.len());
        // Swap-ins whose fitted lead `verify` found over the budget: left
        // where they are in this lead and the larger ones.
        let mut held_back: Vec<TensorId> = Vec::new();
        let mut scratch = Scratch::default();
        for &lead in &LEADS {
            let all = super::moves::led_swap_ins(self.ctx, self.cost, current, stalled, lead);
            let fitted = self.fitted_lead(current, stalled, lead, &mut held_back, &mut scratch);
            if let Some(f) = fitted
                && Some(&f.schedule) != all.as_ref()
            {
                candidates.push((f.schedule, f.score));
            }
            candidates.extend(all.map(|a| (a, None)));
        }
        let slower_from_s = current_cost.slower_from_s();
        let outcomes: Vec<Outcome> = candidates
            .into_par_iter()
            .map_init(Scratch::default, |scratch, (candidate, known)| {
                if let Some(score) = known {
                    // Scored once already: a feasible one that is slower
                    // than the bar is not taken either way.
                    return outcome_of_score(score, candidate).unwrap_or(Outcome::Invalid);
                }
                if Instant::now() >= self.limits.deadline {
                    return Outcome::Late;
                }
                outcome_of(self.search, candidate, slower_from_s, scratch)
                    .unwrap_or(Outcome::Invalid)
            })
            .collect();
        stats.moves_scored += scored(&outcomes);
        // The fastest feasible one, ties to the earlier candidate (the
        // smaller lead, its fitted one first).
        let (time_s, schedule) = outcomes
            .into_iter()
            .filter_map(|o| match o {
                Outcome::Feasible(t, s) => Some((t, s)),
                _ => None,
            })
            .reduce(|a, b| if b.0 < a.0 { b } else { a })?;
        let c = Cost::feasible(time_s);
        c.beats(&current_cost).then_some((schedule, c))
    }

    /// `current` with the swap-ins of `stalled` (less `held_back`) started
    /// earlier by `lead`, each held to the modelled resident bytes
    /// ([`super::moves::fitted_swap_ins`]), made again without the swap-ins
    /// `verify` finds over the budget ([`Step::held_back_where_over`]).
    ///
    /// Why: the model behind the fit is not `verify`'s accounting, and one
    /// swap-in it lets through makes the whole candidate infeasible. On the
    /// PyTorch GPT-2 export at 25% on `h100-80gb` the token embedding's
    /// weight, copied back in after its gradient's add for its update,
    /// took every fitted lead to 987 MiB of the 842 MiB budget: the model
    /// put that stretch at 900 MiB before any lead, so it saw room where
    /// `verify` saw none, and no stalled swap-in was led at all.
    fn fitted_lead(
        &self,
        current: &Schedule,
        stalled: &[TensorId],
        lead: f64,
        held_back: &mut Vec<TensorId>,
        scratch: &mut Scratch,
    ) -> Option<Fitted> {
        let budget_bytes = self.search.request.budget_bytes;
        self.held_back_where_over(current, stalled, held_back, scratch, |targets| {
            super::moves::fitted_swap_ins(self.ctx, self.cost, current, targets, lead, budget_bytes)
        })
    }

    /// `lead(targets)` for the swap-ins of `stalled` not in `held_back`;
    /// where `verify` finds the result over the budget, at the swap-in of
    /// one of them or at a compute op that one of them was led across (the
    /// largest of those, [`led_across`]), that one is added to `held_back`
    /// and the lead made again, at most [`FITTED_REPAIRS`] times. Each try
    /// costs an evaluation; the last one's score comes with the lead, so
    /// that it is not scored again.
    fn held_back_where_over(
        &self,
        current: &Schedule,
        stalled: &[TensorId],
        held_back: &mut Vec<TensorId>,
        scratch: &mut Scratch,
        lead: impl Fn(&[TensorId]) -> Option<Schedule>,
    ) -> Option<Fitted> {
        let targets = |held_back: &[TensorId]| -> Vec<TensorId> {
            stalled
                .iter()
                .copied()
                .filter(|t| !held_back.contains(t))
                .collect()
        };
        let mut led = lead(&targets(held_back))?;
        for _ in 0..FITTED_REPAIRS {
            if Instant::now() >= self.limits.deadline {
                break;
            }
            let score = self.search.score(&led, scratch);
            let culprit = match score
                .as_ref()
                .ok()
                .and_then(|s| self.search.peak_at(&led, s))
            {
                Some(PeakAt::SwapIn(t)) => Some(t),
                Some(PeakAt::Position(p)) => led_across(self.ctx, current, &led, p),
                None => None,
            };
            let Some(culprit) = culprit.filter(|t| stalled.contains(t) && !held_back.contains(t))
            else {
                return Some(Fitted {
                    schedule: led,
                    score: Some(score),
                });
            };
            held_back.push(culprit);
            led = lead(&targets(held_back))?;
        }
        Some(Fitted {
            schedule: led,
            score: None,
        })
    }

    /// Makes the other improving moves of a batch on top of the one taken
    /// (`rest`, made for `before`, best first), each scored alone and kept
    /// where it still beats the current cost; a move whose gap the ones
    /// before it changed is skipped ([`Move::carried_over`]).
    ///
    /// Why: after a move is taken the next round scores a batch again, and
    /// with the dearest recomputations first it is mostly the same batch: on
    /// GPT-2 b8 at 25% on `v100-16gb-pcie3`, the fastest seed's search took
    /// one move per 32 scored (16 of 482 in 5 s), each batch holding
    /// several improving moves on different tensors.
    fn chain(
        &self,
        before: &Schedule,
        rest: &[Move],
        (current, current_cost): (&mut Schedule, &mut Cost),
        stats: &mut LocalStats,
    ) {
        for &mv in rest {
            if self.limits.reached(stats) {
                return;
            }
            let Some(mv) = mv.carried_over(before, current) else {
                continue;
            };
            let outcome = score_batch(
                self.search,
                self.ctx,
                self.cost,
                (current, current_cost.slower_from_s()),
                &[mv],
                self.limits.deadline,
            );
            stats.moves_scored += scored(&outcome);
            let Some(Outcome::Feasible(time_s, schedule)) = outcome.into_iter().next() else {
                continue;
            };
            let c = Cost::feasible(time_s);
            if c.beats(current_cost) {
                *current = schedule;
                *current_cost = c;
                stats.moves_accepted += 1;
                stats.accepted_by_kind[kind_index(mv)] += 1;
            }
        }
    }
}

/// A score, or the error the schedule met (lowering or verification).
type Scored = Result<Score, outcore_plan::PlannerError>;

/// A fitted lead ([`Step::fitted_lead`]) and, where the repair scored it
/// last, its score.
struct Fitted {
    schedule: Schedule,
    score: Option<Scored>,
}

/// The largest tensor whose swap-in `led` (a lead of `current`, gap for
/// gap) starts before position `p` where `current` starts it at or after
/// `p`: the one the lead made resident at `p` that is largest.
fn led_across(ctx: &Ctx<'_>, current: &Schedule, led: &Schedule, p: usize) -> Option<TensorId> {
    current
        .gaps
        .iter()
        .zip(&led.gaps)
        .filter(|(was, now)| {
            let (Some(q_was), Some(q_now)) = (was.prefetch_after, now.prefetch_after) else {
                return false;
            };
            now.how == Restore::Swap && now.before.is_some_and(|b| p < b) && q_now < p && p <= q_was
        })
        .map(|(_, now)| now.tensor)
        .max_by_key(|&t| (ctx.size(t), std::cmp::Reverse(t)))
}

/// Puts the moves that end a recomputation (drop it, swap instead, or
/// exchange it) first, by the recomputed op's time, dearest first; the sort
/// is stable, so ties and the other moves keep their shuffled order.
fn prioritise(ctx: &Ctx<'_>, schedule: &Schedule, moves: &mut [Move]) {
    let saved_s = |gap: usize| -> f64 {
        let g = &schedule.gaps[gap];
        if g.how != Restore::Recompute {
            return 0.0;
        }
        ctx.producer_time_s(g.tensor).unwrap_or(0.0)
    };
    let key = |m: &Move| -> f64 {
        match *m {
            Move::Drop { gap }
            | Move::ToSwap { gap }
            | Move::Exchange { gap, .. }
            | Move::ExchangeOffload { gap, .. }
            | Move::SwapAndOffload { gap, .. } => saved_s(gap),
            _ => 0.0,
        }
    };
    moves.sort_by(|a, b| key(b).total_cmp(&key(a)));
}

/// `from` after [`KICK_MOVES`] random moves that keep it feasible (whatever
/// their time), or `None` if no move of a batch did.
fn kick(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    from: &Schedule,
    limits: &Limits,
    rng: &mut ChaCha8Rng,
    stats: &mut LocalStats,
) -> Option<(Schedule, Cost)> {
    let mut current = from.clone();
    let mut current_cost = None;
    let mut moves = Vec::new();
    for _ in 0..KICK_MOVES {
        Neighbourhood::of(ctx, &current, limits.kinds).moves(ctx, &current, &mut moves);
        moves.shuffle(rng);
        let batch = &moves[..moves.len().min(BATCH)];
        let outcomes = score_batch(search, ctx, cost, (&current, None), batch, limits.deadline);
        stats.moves_scored += scored(&outcomes);
        let first = outcomes.into_iter().find_map(|o| match o {
            Outcome::Feasible(t, s) => Some((s, t)),
            _ => None,
        });
        let (schedule, t) = first?;
        current = schedule;
        current_cost = Some(Cost::feasible(t));
    }
    current_cost.map(|c| (current, c))
}

/// How many of a batch's candidates were scored (not [`Outcome::Late`]).
fn scored(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| !matches!(o, Outcome::Late))
        .count()
}

/// Adds a batch's point to the search curve (see [`LocalStats::curve`]).
fn record_batch(stats: &mut LocalStats, outcomes: &[Outcome], after: Cost) {
    let times: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Feasible(t, _) | Outcome::Slower(t) => Some(*t),
            _ => None,
        })
        .collect();
    let (mean, worst) = if times.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        (
            times.iter().sum::<f64>() / times.len() as f64,
            times.iter().copied().fold(f64::MIN, f64::max),
        )
    };
    let current = if after.is_feasible() {
        after.time_s
    } else {
        f64::NAN
    };
    stats
        .curve
        .push([stats.moves_scored as f64, current, mean, worst]);
}

/// Scores `batch`'s moves on `current` in parallel, in the batch's order of
/// outcomes; a candidate reached once `deadline` has passed is
/// [`Outcome::Late`] (module docs), one simulated in `slower_from_s` or
/// more (where given) [`Outcome::Slower`].
fn score_batch(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    (current, slower_from_s): (&Schedule, Option<f64>),
    batch: &[Move],
    deadline: Instant,
) -> Vec<Outcome> {
    batch
        .par_iter()
        .map_init(Scratch::default, |scratch, &mv| {
            if Instant::now() >= deadline {
                return Outcome::Late;
            }
            let candidate = apply(ctx, cost, current, mv);
            outcome_of(search, candidate, slower_from_s, scratch).unwrap_or_else(|e| {
                if std::env::var_os("OUTCORE_DEBUG_MOVES").is_some() {
                    eprintln!("{mv:?}: {e}");
                }
                Outcome::Invalid
            })
        })
        .collect()
}

/// What scoring `candidate` comes to; `Err` where the lowering or the
/// verifier refused it ([`Outcome::Invalid`]). With `slower_from_s`, a
/// candidate simulated in that time or more is [`Outcome::Slower`],
/// unverified.
fn outcome_of(
    search: &Search<'_, '_>,
    candidate: Schedule,
    slower_from_s: Option<f64>,
    scratch: &mut Scratch,
) -> Result<Outcome, outcore_plan::PlannerError> {
    let score = match slower_from_s {
        None => search.score(&candidate, scratch)?,
        Some(from_s) => match search.score_unless_slower(&candidate, scratch, from_s)? {
            Screen::Slower { iter_time_s } => return Ok(Outcome::Slower(iter_time_s)),
            Screen::Scored(score) => score,
        },
    };
    outcome_of_score(Ok(score), candidate)
}

/// The outcome of `candidate` scored as `score`.
fn outcome_of_score(
    score: Scored,
    candidate: Schedule,
) -> Result<Outcome, outcore_plan::PlannerError> {
    Ok(match score? {
        Score::Feasible { iter_time_s, .. } => Outcome::Feasible(iter_time_s, candidate),
        Score::OverBudget { needed_bytes, .. } => Outcome::OverBudget(needed_bytes, candidate),
        _ => Outcome::Infeasible,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{mlp_chain, v100};
    use outcore_graph::footprint;
    use outcore_plan::PlanRequest;
    use std::time::Duration;

    /// The third saved activation swapped over its forward-to-backward
    /// interval, its swap-in triggered by the op right before its use: the
    /// schedule, the tensor and the interval.
    fn late_swap_in(ctx: &Ctx<'_>) -> (Schedule, outcore_graph::TensorId, usize, usize) {
        let t = ctx.saved_activations()[2];
        let (after, before) = ctx.forward_backward_gap(t).expect("a saved activation");
        let late = ctx.schedule(vec![outcore_plan::Gap {
            tensor: t,
            after: Some(after),
            before: Some(before),
            how: Restore::Swap,
            prefetch_after: Some(before - 1),
            reclaim_before: None,
            copy_out_after: None,
        }]);
        (late, t, after, before)
    }

    /// Every other saved activation recomputed where the backward pass reads
    /// it (its input, the one before, is kept).
    fn every_other_recomputed(ctx: &Ctx<'_>) -> Vec<outcore_plan::Gap> {
        ctx.saved_activations()
            .into_iter()
            .filter(|&t| ctx.graph.tensor(t).producer.is_some())
            .step_by(2)
            .filter_map(|t| {
                let (after, before) = ctx.forward_backward_gap(t)?;
                Some(crate::framework::decisions::recompute_gap(t, after, before))
            })
            .collect()
    }

    /// A search stagnates once it has scored `moves` moves since its time
    /// last fell by `gain`: smaller gains and schedules over the budget do
    /// not restart the count; without a rule it never stagnates.
    #[test]
    fn a_search_stagnates_after_its_moves_without_the_gain() {
        let mut limits = Limits {
            deadline: Instant::now() + Duration::from_secs(3600),
            max_kicks: 0,
            max_moves: usize::MAX,
            kinds: Kinds::All,
            prioritised: false,
            stagnation: Some(Stagnation {
                moves: 100,
                gain: 0.01,
            }),
        };
        let mut stats = LocalStats::default();
        limits.note_progress(&mut stats, Cost::feasible(1.0));
        assert_eq!(stats.since_gain, Some((1.0, 0)));
        // 0.5% faster at move 99: below the 1% gain, the count runs on.
        stats.moves_scored = 99;
        limits.note_progress(&mut stats, Cost::feasible(0.995));
        assert!(!limits.stagnated(&stats) && !limits.reached(&stats));
        stats.moves_scored = 100;
        assert!(limits.stagnated(&stats) && limits.reached(&stats));
        // 1% below 1.0 restarts it at move 100; 100 moves later it is over.
        limits.note_progress(&mut stats, Cost::feasible(0.99));
        assert_eq!(stats.since_gain, Some((0.99, 100)));
        stats.moves_scored = 199;
        assert!(!limits.stagnated(&stats));
        // Over the budget, however fast, it does not restart.
        limits.note_progress(
            &mut stats,
            Cost {
                excess_bytes: 1,
                time_s: 0.1,
            },
        );
        stats.moves_scored = 200;
        assert!(limits.stagnated(&stats));
        limits.stagnation = None;
        assert!(!limits.stagnated(&stats) && !limits.reached(&stats));
    }

    /// A swap-in triggered right before its use makes compute wait for the
    /// whole copy; the polish names it, moves its trigger earlier and ends
    /// the stall. Without a stall nothing is offered.
    #[test]
    fn the_polish_starts_a_stalled_swap_in_earlier() {
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let request = PlanRequest::new(&g, &cost, u64::MAX);
        let search = Search::new(&ctx, &request, "test");
        let (late, t, after, before) = late_swap_in(&ctx);
        let mut scratch = Scratch::default();
        let stall_s = search.stall_s(&late, &mut scratch).expect("feasible");
        // The copy (1 MiB at 12 GB/s, 97 us with its latency) is longer than
        // the op before the use (a 256 x 1024 x 1024 matmul, 34 us).
        assert!(stall_s > 30e-6, "{stall_s}");
        assert_eq!(search.stalled_swap_ins(&late), vec![t]);
        let time_s = |s: &Schedule| match search.score(s, &mut Scratch::default()) {
            Ok(Score::Feasible { iter_time_s, .. }) => iter_time_s,
            other => panic!("{other:?}"),
        };
        let start = (late.clone(), Cost::feasible(time_s(&late)));
        let deadline = Instant::now() + Duration::from_secs(600);
        let (polished, polished_cost, stats) = polish(
            &search,
            &ctx,
            &cost,
            start.clone(),
            0,
            (deadline, usize::MAX),
        );
        assert!(polished_cost.beats(&start.1), "{polished_cost:?}");
        assert!(stats.moves_accepted >= 1 && stats.converged);
        assert_eq!(stats.accepted_by_kind[3], stats.moves_accepted);
        let trigger = polished.gaps[0].prefetch_after.expect("timed");
        assert!(after <= trigger && trigger < before - 1, "{trigger}");
        let polished_stall_s = search.stall_s(&polished, &mut scratch).expect("feasible");
        assert!(polished_stall_s < stall_s, "{polished_stall_s}");
        // Kept on the device: nothing waits, nothing is offered.
        let kept = ctx.schedule(Vec::new());
        assert!(search.stalled_swap_ins(&kept).is_empty());
        let kept_cost = Cost::feasible(time_s(&kept));
        let (same, _, stats) = polish(
            &search,
            &ctx,
            &cost,
            (kept.clone(), kept_cost),
            0,
            (deadline, usize::MAX),
        );
        assert_eq!(same, kept);
        assert_eq!(stats.moves_scored, 0);
    }

    /// A swap-in triggered right before its use is started where the ops up
    /// to the use take the lead times its copy, which ends the stall; a
    /// trigger already that early is left, and then nothing moves.
    #[test]
    fn a_lead_starts_the_stalled_swap_ins_earlier() {
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let request = PlanRequest::new(&g, &cost, u64::MAX);
        let search = Search::new(&ctx, &request, "test");
        let (late, t, after, before) = late_swap_in(&ctx);
        let led = super::super::moves::led_swap_ins(&ctx, &cost, &late, &[t], 2.0)
            .expect("the trigger moves");
        let trigger = led.gaps[0].prefetch_after.expect("timed");
        let copy_s = cost.h2d_time_s(ctx.size(t));
        assert!(after <= trigger && trigger < before - 1, "{trigger}");
        assert!(ctx.time_s(trigger + 1, before) >= 2.0 * copy_s);
        // One position later would not cover the lead.
        assert!(ctx.time_s(trigger + 2, before) < 2.0 * copy_s);
        let mut scratch = Scratch::default();
        let late_stall_s = search.stall_s(&late, &mut scratch).expect("feasible");
        let led_stall_s = search.stall_s(&led, &mut scratch).expect("feasible");
        assert!(
            led_stall_s < late_stall_s,
            "{led_stall_s} vs {late_stall_s}"
        );
        // Already led: a smaller lead moves nothing; another tensor neither.
        assert!(super::super::moves::led_swap_ins(&ctx, &cost, &led, &[t], 1.5).is_none());
        let other = ctx.saved_activations()[3];
        assert!(super::super::moves::led_swap_ins(&ctx, &cost, &late, &[other], 2.0).is_none());
    }

    /// Held to a budget, the lead stops at the first position (going back
    /// from the trigger) where the swapped tensor would not fit beside what
    /// is resident there; with room everywhere it is the plain lead.
    #[test]
    fn a_fitted_lead_stops_where_memory_is_full() {
        use super::super::moves::{fitted_swap_ins, led_swap_ins};
        use crate::framework::pressure::resident_bytes;
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let (late, t, _, before) = late_swap_in(&ctx);
        let now = before - 1;
        let led = led_swap_ins(&ctx, &cost, &late, &[t], 2.0).expect("the trigger moves");
        let led_trigger = led.gaps[0].prefetch_after.expect("timed");
        let roomy = fitted_swap_ins(&ctx, &cost, &late, &[t], 2.0, u64::MAX / 2);
        assert_eq!(roomy.as_ref(), Some(&led));
        // The fullest position the lead passes (the latest of equals): with
        // a byte less than it needs there, the trigger stops at it.
        let resident = resident_bytes(&ctx, &late.gaps);
        let size = i128::from(ctx.size(t));
        let full = (led_trigger + 1..=now)
            .max_by_key(|&p| resident[p])
            .expect("the lead passes a position");
        assert!(
            led_trigger < full && full < now,
            "{led_trigger} {full} {now}"
        );
        let budget = u64::try_from(resident[full] + size - 1).expect("positive");
        let fitted = fitted_swap_ins(&ctx, &cost, &late, &[t], 2.0, budget).expect("moves");
        assert_eq!(fitted.gaps[0].prefetch_after, Some(full));
        // No room at the trigger's own next position: nothing moves.
        let tight = u64::try_from(resident[now] + size - 1).expect("positive");
        assert!(fitted_swap_ins(&ctx, &cost, &late, &[t], 2.0, tight).is_none());
    }

    /// A swap-in started right after its tensor leaves, in the forward pass,
    /// holds it through the peak at the first backward op: under the budget
    /// the late schedule needs, `verify` puts the early one over there, and
    /// the tensor is the one the lead made resident there; the late schedule
    /// fits. A lead that `verify` finds over the budget is made again
    /// without that swap-in.
    #[test]
    fn a_lead_holds_back_the_swap_in_verify_finds_over_the_budget() {
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let (late, t, after, _) = late_swap_in(&ctx);
        let mut early = late.clone();
        early.gaps[0].prefetch_after = Some(after + 1);
        let needed = |s: &Schedule| {
            let request = PlanRequest::new(&g, &cost, 1);
            let search = Search::new(&ctx, &request, "test");
            match search.score(s, &mut Scratch::default()) {
                Ok(Score::OverBudget { needed_bytes, .. }) => needed_bytes,
                other => panic!("{other:?}"),
            }
        };
        let late_bytes = needed(&late);
        assert!(needed(&early) > late_bytes);
        let request = PlanRequest::new(&g, &cost, late_bytes);
        let search = Search::new(&ctx, &request, "test");
        let mut scratch = Scratch::default();
        let mut peak_at = |s: &Schedule| {
            let score = search.score(s, &mut scratch).expect("valid");
            search.peak_at(s, &score)
        };
        assert_eq!(peak_at(&late), None);
        // The peak: the first backward op, with `t` already back.
        let Some(PeakAt::Position(p)) = peak_at(&early) else {
            panic!("the peak is at a compute op");
        };
        assert_eq!(ctx.op_at(p).name, "fc11.backward");
        assert_eq!(led_across(&ctx, &late, &early, p), Some(t));
        assert_eq!(led_across(&ctx, &late, &late, p), None);
        // A lead that ignores the budget (as a model that saw room
        // everywhere would) starts `t` right after it leaves: `verify` finds
        // it over at the first backward op, so `t` is held back, and
        // without it nothing is led. Under a roomy budget the lead stands
        // and nothing is held back.
        let limits = Limits {
            deadline: Instant::now() + Duration::from_secs(600),
            max_kicks: 0,
            max_moves: usize::MAX,
            kinds: Kinds::SwapTiming,
            prioritised: false,
            stagnation: None,
        };
        let step = Step {
            search: &search,
            ctx: &ctx,
            cost: &cost,
            limits: &limits,
        };
        let blind = |targets: &[TensorId]| -> Option<Schedule> {
            (!targets.is_empty()).then(|| early.clone())
        };
        let mut held_back = Vec::new();
        let led = step
            .held_back_where_over(&late, &[t], &mut held_back, &mut scratch, blind)
            .map(|f| f.schedule);
        assert_eq!((led, held_back), (None, vec![t]));
        let roomy_request = PlanRequest::new(&g, &cost, u64::MAX / 2);
        let roomy_search = Search::new(&ctx, &roomy_request, "test");
        let roomy = Step {
            search: &roomy_search,
            ..step
        };
        let mut held_back = Vec::new();
        let led = roomy
            .held_back_where_over(&late, &[t], &mut held_back, &mut scratch, blind)
            .map(|f| f.schedule);
        assert_eq!((led, held_back), (Some(early.clone()), Vec::new()));
    }

    /// At the full footprint every recomputation costs time and no memory is
    /// needed, so dropping any of them improves: one batch holds many
    /// improving moves on different tensors, and the chain takes a second
    /// one after the batch's best with one more move scored (the search is
    /// stopped there by its move limit; without the chain a second move
    /// would take a second batch).
    #[test]
    fn the_other_improving_moves_of_a_batch_are_taken_on_top() {
        let g = mlp_chain(16, 512, 64);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let (fp, _) = footprint(&g);
        let request = PlanRequest::new(&g, &cost, fp);
        let search = Search::new(&ctx, &request, "test");
        let gaps = every_other_recomputed(&ctx);
        assert!(gaps.len() >= 4, "{} recomputations", gaps.len());
        let start = ctx.schedule(gaps);
        let start_cost = match search.score(&start, &mut Scratch::default()) {
            Ok(Score::Feasible { iter_time_s, .. }) => Cost::feasible(iter_time_s),
            other => panic!("{other:?}"),
        };
        let limits = Limits {
            deadline: Instant::now() + Duration::from_secs(3600),
            max_kicks: 0,
            max_moves: BATCH + 1,
            kinds: Kinds::All,
            prioritised: true,
            stagnation: None,
        };
        let (_, reached, stats) = improve(&search, &ctx, &cost, (start, start_cost), 0, &limits);
        assert_eq!(stats.curve.len(), 1, "one batch");
        assert_eq!(stats.moves_scored, BATCH + 1);
        assert_eq!(stats.moves_accepted, 2, "{stats:?}");
        assert!(reached.beats(&start_cost));
    }

    /// Screening a batch by the current schedule's time changes nothing the
    /// climb takes: every candidate that is not [`Outcome::Slower`] has the
    /// outcome it has unscreened, and every one that is would not beat the
    /// current cost (its time is the unscreened one's; over the budget or
    /// unsafe it would not have been taken either). The schedule: every
    /// other saved activation recomputed, under the budget it needs, so
    /// that the batch holds faster and slower candidates.
    #[test]
    fn screened_candidates_are_those_the_climb_would_not_take() {
        let g = mlp_chain(16, 512, 64);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let gaps = every_other_recomputed(&ctx);
        let current = ctx.schedule(gaps);
        // The budget is what the schedule needs: every move that needs more
        // is over it.
        let (fp, _) = footprint(&g);
        let needed_bytes = Search::new(&ctx, &PlanRequest::new(&g, &cost, fp), "test")
            .needed_bytes(&current)
            .expect("verifies");
        let request = PlanRequest::new(&g, &cost, needed_bytes);
        let search = Search::new(&ctx, &request, "test");
        let current_cost = match search.score(&current, &mut Scratch::default()) {
            Ok(Score::Feasible { iter_time_s, .. }) => Cost::feasible(iter_time_s),
            other => panic!("{other:?}"),
        };
        let mut moves = Vec::new();
        Neighbourhood::of(&ctx, &current, Kinds::All).moves(&ctx, &current, &mut moves);
        assert!(moves.len() >= 8, "{} moves", moves.len());
        let later = Instant::now() + Duration::from_secs(3600);
        let slower_from = current_cost.slower_from_s();
        let plain = score_batch(&search, &ctx, &cost, (&current, None), &moves, later);
        let screened = score_batch(&search, &ctx, &cost, (&current, slower_from), &moves, later);
        let (mut slower, mut faster, mut over) = (0, 0, 0);
        for (p, s) in plain.iter().zip(&screened) {
            match (p, s) {
                (Outcome::Feasible(t, a), Outcome::Feasible(u, b)) => {
                    assert!(t == u && a == b);
                    assert!(Cost::feasible(*t).beats(&current_cost));
                    faster += 1;
                }
                (Outcome::OverBudget(n, a), Outcome::OverBudget(m, b)) => {
                    assert!(n == m && a == b);
                    over += 1;
                }
                (Outcome::Invalid, Outcome::Invalid)
                | (Outcome::Infeasible, Outcome::Infeasible) => {}
                (p, Outcome::Slower(t)) => {
                    assert!(*t >= slower_from.expect("feasible"));
                    assert!(!Cost::feasible(*t).beats(&current_cost));
                    if let Outcome::Feasible(u, _) = p {
                        assert_eq!(t, u);
                    }
                    slower += 1;
                }
                _ => panic!("the screen changed an outcome"),
            }
        }
        assert!(
            slower > 0 && faster > 0,
            "{slower} slower, {faster} faster, {over} over the budget"
        );
    }

    /// A repair's pace on a unit clock (a span of 8 s, checks each second):
    /// nothing is judged before the second check; one that sheds 1 GB a
    /// second with 4 GB left at 4 s (4 s left, 8 GB at twice the pace)
    /// goes on; one that shed 0.1 GB in the last second with 2 GB left at
    /// 6 s (2 s left: 0.4 GB at twice the pace) is given up; between checks
    /// nothing is judged again.
    #[test]
    fn a_repair_too_slow_for_its_time_is_given_up() {
        const GB: u64 = 1_000_000_000;
        let pace = |excess_bytes| RepairPace {
            started: Instant::now(),
            span_s: 8.0,
            last: (0, excess_bytes),
        };
        // No progress at all, but before the second check.
        let mut early = pace(10 * GB);
        assert!(!early.hopeless_at(0.5, 10 * GB));
        assert!(!early.hopeless_at(1.5, 10 * GB));
        // The second check with nothing shed since the first: given up.
        assert!(early.hopeless_at(2.1, 10 * GB));
        let mut steady = pace(8 * GB);
        assert!(!steady.hopeless_at(3.0, 5 * GB));
        assert!(!steady.hopeless_at(4.0, 4 * GB));
        let mut slowing = pace(8 * GB);
        assert!(!slowing.hopeless_at(5.0, 2_100_000_000));
        assert!(slowing.hopeless_at(6.0, 2 * GB));
        // Within the same second as the last check: not judged again.
        let mut once = pace(8 * GB);
        assert!(!once.hopeless_at(5.0, GB));
        assert!(!once.hopeless_at(5.5, GB));
        // Nothing over the budget is never hopeless.
        let mut done = pace(GB);
        assert!(!done.hopeless_at(3.0, 0));
    }

    /// A batch reached after its deadline scores none of its candidates, and
    /// counts none as scored; one well before it scores them all.
    #[test]
    fn candidates_past_the_deadline_are_not_scored() {
        let g = mlp_chain(32, 512, 64);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let (fp, _) = footprint(&g);
        let request = PlanRequest::new(&g, &cost, fp);
        let search = Search::new(&ctx, &request, "test");
        // Every tensor kept: the repair moves (a swap or a recomputation
        // added) are this schedule's neighbourhood.
        let schedule = ctx.schedule(Vec::new());
        let mut moves = Vec::new();
        Neighbourhood::of(&ctx, &schedule, Kinds::All).repairs(&ctx, &schedule, &mut moves);
        assert!(moves.len() >= BATCH, "{} moves", moves.len());
        let batch = &moves[..BATCH];

        let past = Instant::now();
        let late = score_batch(&search, &ctx, &cost, (&schedule, None), batch, past);
        assert_eq!(late.len(), BATCH);
        assert_eq!(scored(&late), 0);

        let later = Instant::now() + Duration::from_secs(3600);
        let on_time = score_batch(&search, &ctx, &cost, (&schedule, None), batch, later);
        assert_eq!(scored(&on_time), BATCH);
        assert!(
            on_time.iter().any(|o| matches!(o, Outcome::Feasible(..))),
            "a tensor taken off the device still fits the full footprint"
        );
    }
}
