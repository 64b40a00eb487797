//! The local search after its first phase: the main neighbourhood's search
//! continued and the polish of swap timing ([`local::polish`]) in turns on
//! one schedule.
//!
//! The rule: the continued search runs first, until a reserve point (as
//! before: a share of the time left that follows the stalls,
//! [`polish_share`]) or until it stagnates ([`STAGNATION`]: no gain of
//! 0.5% in 2,048 moves), whichever comes first; then, while compute waits
//! for swap-ins, the polish, until it converges (no retime improves) or
//! the time is spent; then the continued search again from the polished
//! schedule, and so on. Each run of a phase is one uninterrupted search.
//! The continued search is held to the stagnation rule only while the
//! polish could take its time (the schedule stalls and the polish has not
//! converged on it); else it runs to the reserve point or the deadline.
//!
//! Why: before, the polish ran once, at the end, in its share.
//! - Where the continued search has stagnated, the polish gains more. On
//!   the PyTorch GPT-2 export at 25% on `h100-80gb` (`--seconds 5`,
//!   8a51d5d) the continued search took the fastest schedule from
//!   0.05909 s to 0.05901 s in 2,508 moves, and the polish after it from
//!   0.05901 s to 0.05494 s in 1,119, its share spent.
//! - Where the polish converges early, the rest of its share was lost.
//! - Not short turns chosen by gain per move (tried first): the continued
//!   search gains in bursts, far apart (on BERT-base at 12.5% on
//!   `h100-80gb` its first 1,216 moves gained 0.05%, then 0.85% by move
//!   1,383), and a turn of 512 moves restarts its scan of the
//!   neighbourhood with the same prioritised moves first, which is the
//!   likely reason it then gained little (not traced move by move); the
//!   polish took most turns, and retimes
//!   accepted early steer the continued search's later moves elsewhere
//!   (as [`local::polish`]'s doc records for a polish at each local
//!   optimum). On `bench-suite --planners outcore --seconds 5` that moved
//!   the GPT-2 export at 25% up (0.654 / 0.494 to 0.677 / 0.511 of ideal on
//!   `h100-80gb` / `v100-16gb-pcie3`) and 8 cases down (BERT-base at 12.5%
//!   by 0.01, the GPT-2 export at 50% on `v100-16gb-pcie3` by 0.012).
//!
//! Once the polish has converged on a schedule that still stalls, one more
//! polish run starts from that schedule with its largest parameter kept
//! from its last read in the backward pass to its update and the swap-ins
//! that then no longer fit started later ([`to_update`]); at the next
//! convergence, one from the schedule with room made at its largest
//! working set ([`room`]: saved activations resident there recomputed).
//! Each result is taken where it is faster; each is tried once per search.
//!
//! Reproducible: the stagnation rule counts moves, not seconds, so under
//! move bounds alone (a deadline far away) the plan depends on the seed
//! alone.

use super::local::{self, Cost, LocalStats, Stagnation};
use super::{Joint, Reached, fastest_reached, summary};
use super::{room, to_update};
use crate::Planner;
use crate::framework::{Ctx, Scratch, Search};
use outcore_plan::{PlanRequest, Schedule};
use std::time::{Duration, Instant};

/// When the continued search hands its time to the polish: 2,048 moves
/// without a gain of 0.5%. Measured at `--seconds 5` on 8a51d5d: on the
/// PyTorch GPT-2 export at 25% on `h100-80gb` the continued search gained
/// 0.14% in 2,508 moves and the polish after it 7% in 1,119 (cut by the
/// time); on BERT-base b32 at 12.5% there the search gained 0.85% in its
/// first 1,383 moves, 1.4% in 4,965, and the polish after it 3% in 414;
/// on DenseNet-121 b64 at 12.5% the search gained 2.6% in 2,977 (nothing
/// stalls there). With a gain of 0.1% the GPT-2 export's search never
/// stagnated.
pub const STAGNATION: Stagnation = Stagnation {
    moves: 2048,
    gain: 5e-3,
};

/// The least share of the time left after the first phase from which the
/// polish takes over, when the schedule stalls ([`polish_share`]).
pub const POLISH_SHARE: f64 = 0.1;

/// The most of the time left after the first phase from which the polish
/// takes over ([`polish_share`]).
pub const MAX_POLISH_SHARE: f64 = 0.5;

/// The polish's share of the time left after the first phase, for a
/// schedule that waits `stall_share` of its time: that share, between
/// [`POLISH_SHARE`] and [`MAX_POLISH_SHARE`]. The polish takes over there
/// at the latest.
///
/// Why: where compute waits for much of the iteration the polish's retimes
/// gain more per move scored than the second phase's moves. On the PyTorch
/// GPT-2 export at 25% on `v100-16gb-pcie3` (63% of the iteration stalled)
/// a 30 s search's polish took 0.328 s to 0.297 s in 7,323 moves, where
/// its second phase had taken 0.338 s to 0.328 s in 6,520. Measured
/// (`outcore bench-suite --planners outcore --seconds 5`, 2026-11-29,
/// against a fixed tenth): 5 of 96 cases up by more than 0.003 of ideal
/// (that export at 25% 0.329 / 0.417 to 0.344 / 0.424 on `v100-16gb-pcie3`
/// / `h100-80gb`; BERT-base at 50% on `h100-80gb` 0.923 to 0.930), none
/// down.
pub fn polish_share(stall_share: f64) -> f64 {
    stall_share.clamp(POLISH_SHARE, MAX_POLISH_SHARE)
}

/// The two phases that take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Main = 0,
    Polish = 1,
}

/// Which phase runs next (module docs): after the continued search the
/// polish where it is ready (the schedule stalls and it has not converged
/// on it), else the continued search where it is open (it has not
/// converged on the schedule and has moves left), else the other.
fn next_phase(last: Option<Phase>, main_open: bool, polish_ready: bool) -> Option<Phase> {
    match last {
        Some(Phase::Main) if polish_ready => Some(Phase::Polish),
        _ if main_open => Some(Phase::Main),
        _ if polish_ready => Some(Phase::Polish),
        _ => None,
    }
}

/// Each phase's runs, and what they did together.
#[derive(Debug, Default)]
struct Account {
    runs: usize,
    improved: bool,
    stats: LocalStats,
}

/// The turns' summaries (one per phase that ran, from `start`'s cost to
/// `end_cost`) and the label of where they ended: `start`'s, with each
/// phase that improved it and each restart that did.
fn report(
    start: &Reached,
    accounts: &[Account; 2],
    restarts_improved: [Option<bool>; 2],
    end_cost: Cost,
) -> (Vec<serde_json::Value>, String) {
    let runs: Vec<serde_json::Value> = [Phase::Main, Phase::Polish]
        .into_iter()
        .filter(|p| accounts[*p as usize].runs > 0)
        .map(|p| {
            let account = &accounts[p as usize];
            let label = phase_label(&start.label, p);
            let mut s = summary(&label, start.cost, end_cost, &account.stats);
            s["runs"] = account.runs.into();
            if p == Phase::Polish {
                s["kept_improved"] = restarts_improved[Restart::Kept as usize].into();
                s["room_improved"] = restarts_improved[Restart::Room as usize].into();
            }
            s
        })
        .collect();
    let mut label = start.label.clone();
    for p in [Phase::Main, Phase::Polish] {
        if accounts[p as usize].improved {
            label = phase_label(&label, p);
        }
    }
    if restarts_improved[Restart::Kept as usize] == Some(true) {
        label = format!("{label} (kept to its update)");
    }
    if restarts_improved[Restart::Room as usize] == Some(true) {
        label = format!("{label} (room at the largest working set)");
    }
    (runs, label)
}

impl Joint {
    /// The second phase of [`Joint::improve_best`]: from the fastest
    /// feasible schedule whose first-phase search the time limit cut short
    /// (else the fastest reached, with the polish alone), the two phases in
    /// turns until `deadline`; one summary per phase that ran, and where
    /// they got.
    pub(super) fn turns(
        &self,
        request: &PlanRequest<'_>,
        reached: &[Reached],
        deadline: Instant,
    ) -> Option<(Vec<serde_json::Value>, Reached)> {
        let unfinished = reached
            .iter()
            .filter(|r| !r.converged && r.cost.is_feasible())
            .min_by(|a, b| a.cost.time_s.total_cmp(&b.cost.time_s));
        let start = unfinished.or_else(|| fastest_reached(reached))?;
        let mut current = (start.schedule.clone(), start.cost);
        // The moves keep the order, so one evaluator serves every run.
        let ctx = Ctx::new(request.graph, request.cost, current.0.order.clone());
        let search = Search::new(&ctx, request, self.name());
        let mut scratch = Scratch::default();
        let mut stalls = |schedule: &Schedule, cost: Cost| {
            search
                .stall_s(schedule, &mut scratch)
                .map_or(0.0, |stall_s| stall_s / cost.time_s)
        };
        let start_stalls = stalls(&current.0, current.1);
        let reserve = if self.polish_swap_timing && start_stalls > local::MIN_GAIN {
            let left = deadline.saturating_duration_since(Instant::now());
            left.mul_f64(polish_share(start_stalls))
        } else {
            Duration::ZERO
        };
        let reserve_at = deadline.checked_sub(reserve).unwrap_or(deadline);
        let mut accounts = [Account::default(), Account::default()];
        // Converged on the current schedule (or, the continued search, no
        // search to continue): open again once the other changes it.
        let mut converged = [unfinished.is_none(), false];
        let mut last = None;
        // Per restart: `None` until it has run, then whether it improved.
        let mut restarts_improved: [Option<bool>; 2] = [None; 2];
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // A run may end past its limit: the limit is checked between
            // batches, and a batch scores up to `local::BATCH` moves.
            let moves_left = |p: Phase| {
                self.max_moves
                    .saturating_sub(accounts[p as usize].stats.moves_scored)
            };
            let main_open = !converged[0] && moves_left(Phase::Main) > 0;
            let polish_ready = self.polish_swap_timing
                && !converged[1]
                && moves_left(Phase::Polish) > 0
                && stalls(&current.0, current.1) > local::MIN_GAIN;
            // Once the polish has converged, one run from the schedule
            // with the largest parameter kept to its update
            // ([`to_update`]), and one (at the next convergence) from the
            // schedule with room made at its largest working set
            // ([`room`]).
            let restart_ready = self.polish_swap_timing
                && converged[1]
                && moves_left(Phase::Polish) > 0
                && stalls(&current.0, current.1) > local::MIN_GAIN;
            let restart = [Restart::Kept, Restart::Room]
                .into_iter()
                .find(|r| restart_ready && restarts_improved[*r as usize].is_none());
            let phase = if restart.is_some() {
                Phase::Polish
            } else {
                let Some(phase) = next_phase(last, main_open, polish_ready) else {
                    break;
                };
                phase
            };
            let until = if phase == Phase::Main && now < reserve_at {
                reserve_at
            } else {
                deadline
            };
            let run = Run {
                phase,
                seed: run_seed(request.seed, phase, accounts[phase as usize].runs),
                until,
                max_moves: moves_left(phase),
                // Held to the stagnation rule only where the polish could
                // take the time.
                stagnation: polish_ready.then_some(STAGNATION),
                restart,
            };
            let (next, stats, run_converged) =
                self.run_phase((&search, &ctx), request, &current, run);
            let changed = next.1.beats(&current.1);
            if let Some(r) = run.restart {
                restarts_improved[r as usize] = Some(changed);
            }
            let account = &mut accounts[phase as usize];
            account.runs += 1;
            account.improved |= changed;
            absorb(&mut account.stats, &stats);
            converged[phase as usize] = run_converged;
            if changed {
                current = next;
                converged[1 - phase as usize] = false;
            }
            last = Some(phase);
        }
        let (runs, label) = report(start, &accounts, restarts_improved, current.1);
        let reached = Reached {
            label,
            schedule: current.0,
            cost: current.1,
            converged: converged.iter().all(|&c| c),
        };
        Some((runs, reached))
    }

    /// One run of a phase from `current`: where it got, what it did, and
    /// whether it converged there.
    fn run_phase(
        &self,
        (search, ctx): (&Search<'_, '_>, &Ctx<'_>),
        request: &PlanRequest<'_>,
        current: &(Schedule, Cost),
        run: Run,
    ) -> ((Schedule, Cost), LocalStats, bool) {
        match run.phase {
            Phase::Main => {
                let mut limits = self.limits(run.until);
                limits.max_moves = run.max_moves;
                limits.stagnation = run.stagnation;
                let (schedule, cost, stats) = local::improve(
                    search,
                    ctx,
                    request.cost,
                    current.clone(),
                    run.seed,
                    &limits,
                );
                let converged = self.search_converged(&stats);
                ((schedule, cost), stats, converged)
            }
            Phase::Polish if run.restart.is_some() => {
                // From the restart's schedule, taken where the polish gets
                // it below the current one; else the current one stays,
                // converged.
                let restarted = match run.restart {
                    Some(Restart::Kept) => to_update::kept_gap(ctx, &current.0).and_then(|gap| {
                        to_update::kept_to_update(
                            search,
                            ctx,
                            request.cost,
                            &current.0,
                            gap,
                            run.until,
                        )
                    }),
                    // `None` is ruled out by the arm's guard.
                    Some(Restart::Room) | None => room::largest_working_set(ctx, &current.0)
                        .and_then(|at| {
                            room::room_at(
                                search,
                                ctx,
                                request.cost,
                                (&current.0, current.1),
                                at,
                                run.until,
                            )
                        }),
                };
                let Some(restarted) = restarted else {
                    return (current.clone(), LocalStats::default(), true);
                };
                let (schedule, cost, stats) = local::polish(
                    search,
                    ctx,
                    request.cost,
                    restarted,
                    run.seed,
                    (run.until, run.max_moves),
                );
                if cost.beats(&current.1) {
                    let converged = stats.converged;
                    ((schedule, cost), stats, converged)
                } else {
                    (current.clone(), stats, true)
                }
            }
            Phase::Polish => {
                let (schedule, cost, stats) = local::polish(
                    search,
                    ctx,
                    request.cost,
                    current.clone(),
                    run.seed,
                    (run.until, run.max_moves),
                );
                let converged = stats.converged;
                ((schedule, cost), stats, converged)
            }
        }
    }
}

/// One run of a phase: its seed and limits.
#[derive(Debug, Clone, Copy)]
struct Run {
    phase: Phase,
    seed: u64,
    until: Instant,
    max_moves: usize,
    stagnation: Option<Stagnation>,
    /// A polish run from another schedule, once the polish has converged.
    restart: Option<Restart>,
}

/// Where a polish run starts once the polish has converged, instead of the
/// current schedule (each tried once per search, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    /// The largest parameter kept to its update ([`to_update`]).
    Kept = 0,
    /// Room made at the largest working set ([`room`]).
    Room = 1,
}

/// The label of a schedule `phase` improved.
fn phase_label(label: &str, phase: Phase) -> String {
    match phase {
        Phase::Main => format!("{label} (continued)"),
        Phase::Polish => format!("{label} (swap timing)"),
    }
}

/// The seed of `phase`'s run number `run`: the seeds the second phase and
/// the polish had before turns (`seed + 1`, `seed + 2`) for their first
/// runs, distinct ones after.
fn run_seed(seed: u64, phase: Phase, run: usize) -> u64 {
    seed.wrapping_add(1 + phase as u64)
        .wrapping_add(2 * run as u64)
}

/// Adds `run`'s counts to `total` and appends its curve, its move counts
/// shifted by the moves `total` had scored.
fn absorb(total: &mut LocalStats, run: &LocalStats) {
    let offset = total.moves_scored as f64;
    total
        .curve
        .extend(run.curve.iter().map(|p| [p[0] + offset, p[1], p[2], p[3]]));
    total.moves_scored += run.moves_scored;
    total.moves_accepted += run.moves_accepted;
    total.moves_invalid += run.moves_invalid;
    total.moves_infeasible += run.moves_infeasible;
    for (t, k) in total.accepted_by_kind.iter_mut().zip(run.accepted_by_kind) {
        *t += k;
    }
    total.converged = run.converged;
    total.stagnant = run.stagnant;
    total.repair_given_up |= run.repair_given_up;
    total.kicks += run.kicks;
    total.kicks_improved += run.kicks_improved;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_polish_follows_the_continued_search_where_it_is_ready() {
        // First: the continued search where it is open.
        assert_eq!(next_phase(None, true, true), Some(Phase::Main));
        // After it: the polish where it is ready, else the search again.
        assert_eq!(
            next_phase(Some(Phase::Main), true, true),
            Some(Phase::Polish)
        );
        assert_eq!(
            next_phase(Some(Phase::Main), true, false),
            Some(Phase::Main)
        );
        // After the polish: the continued search again.
        assert_eq!(
            next_phase(Some(Phase::Polish), true, true),
            Some(Phase::Main)
        );
    }

    #[test]
    fn a_closed_phase_hands_its_turn_to_the_other_and_both_closed_end() {
        // No search to continue: the polish alone, again while it is ready.
        assert_eq!(next_phase(None, false, true), Some(Phase::Polish));
        assert_eq!(
            next_phase(Some(Phase::Polish), false, true),
            Some(Phase::Polish)
        );
        // The polish converged or nothing stalls: the search alone.
        assert_eq!(
            next_phase(Some(Phase::Polish), true, false),
            Some(Phase::Main)
        );
        assert_eq!(next_phase(Some(Phase::Main), false, false), None);
        assert_eq!(next_phase(None, false, false), None);
    }

    #[test]
    fn the_seeds_are_the_earlier_ones_first_and_distinct_after() {
        assert_eq!(run_seed(10, Phase::Main, 0), 11);
        assert_eq!(run_seed(10, Phase::Polish, 0), 12);
        let seeds: std::collections::HashSet<u64> = (0..4)
            .flat_map(|r| [run_seed(10, Phase::Main, r), run_seed(10, Phase::Polish, r)])
            .collect();
        assert_eq!(seeds.len(), 8);
    }

    #[test]
    fn absorbed_runs_add_up_and_their_curves_follow_on() {
        let mut total = LocalStats::default();
        let run = LocalStats {
            moves_scored: 64,
            moves_accepted: 2,
            accepted_by_kind: [0, 1, 0, 1, 0, 0],
            kicks: 1,
            curve: vec![[32.0, 2.0, 2.5, 3.0], [64.0, 1.5, 2.0, 3.0]],
            ..LocalStats::default()
        };
        absorb(&mut total, &run);
        absorb(&mut total, &run);
        assert_eq!(total.moves_scored, 128);
        assert_eq!(total.moves_accepted, 4);
        assert_eq!(total.accepted_by_kind, [0, 2, 0, 2, 0, 0]);
        assert_eq!(total.kicks, 2);
        let moves: Vec<f64> = total.curve.iter().map(|p| p[0]).collect();
        assert_eq!(moves, vec![32.0, 64.0, 96.0, 128.0]);
    }
}
