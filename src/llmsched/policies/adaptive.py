"""Adaptive: each step's token load and prefill/decode mix from the stability region.

Why: with a batch-size cap `k_max`, a policy that always fills the budget `b_max` can be
unstable although the workload lies inside the stability region (docs/stability.md,
"Beyond the paper: a batch-size cap needs an adaptive policy"): full steps are slow
while decode is capped at `k_max` tokens per step, and the region's boundary may be
reached only by mixing steps of a smaller load (e.g. `b0` of the paper model). This
policy picks, every step, one of the region's vertex step shapes by a max-weight rule on
the two work queues, so it serves the mix the queues need.

Rule (our design):

1. Once per server (b_max, k_max), compute the stability region (`llmsched.core.region`)
   of the run's cost model and keep its vertex shapes `(x_v, y_v)`: x prefill and y decode
   tokens at load `l_v = x_v + y_v`. This happens when the scheduler is built (and again
   when a driver binds another cost model), not on the first step, whose request would wait
   for it (importing the LP solver and solving took about 0.4 s). A context-dependent
   cost model is refitted as the workload means move (1, 2, 4, ... requests seen).
   A refit during a step is a job (`take_job`, `install_job`): by default `build` runs it
   at once (the simulator and the virtual GPU charge no host time for it); a driver that
   sets `defer_jobs` (the PyTorch engine) takes it and runs it off its step loop (a solve
   took 0.13-0.23 s at `b_max` 512 with the h200-llama-3.2-1b profile, a step of the
   tiny model 1-2 ms: docs/engine.md), the region in use planning the steps until it
   installs the result. A region is solved once per key (server, prompt cap, rounded
   means): a key seen again reuses it.
   Under a binding cap (`k_max < b_max`) the region lets one request supply at most the
   longest prompt seen so far as prefill in a step (`max_prefill_per_request`, as
   `capacity` caps it at the workload's longest prompt): the region is refitted when a
   longer prompt is on offer, at most once per doubling of the steps planned (after a
   refit at step s, a longer prompt waits for step 2s), and no more once a prompt reaches
   `b_max`, where the cap changes nothing.
   For a load-only cost model a vertex's load is raised to the largest load with the
   same step time (e.g. `(0, k_max)` to load `b0` under `t(b) = c + a ceil(b / b0)`).
2. Every step, with `Q_p` = prefill tokens not yet computed (waiting and running
   requests) and `Q_d` = decode tokens still owed to requests already decoding, each
   vertex is *realised* on the current state the way the step would be built: up to
   `y_v` decode tokens first, then prefill chunks FCFS (running prefills, then the
   waiting queue, as Sarathi-Serve does) up to the load `l_v`, then more decode tokens
   if budget and batch slots are left (so a vertex never idles budget it could fill at
   the same load). If the prefill requests that fit in the slots left cannot fill the
   load (a prompt's last chunk is short), the vertex is also realised with one decode
   fewer, then two, ..., until the load is filled: a slot goes to the next prompt
   instead of leaving the step's prefill budget unused. A realised shape `(x, y)` scores
   `(Q_p * x + Q_d * y) / t(x, y)`: the queue-weighted service rate. Under a binding cap
   (`k_max < b_max`) the queues are counted in requests instead: `Q_p` = requests with
   prefill left (waiting and prefilling), `Q_d` = decoding requests.
3. The best-scoring realisation is the step. Ties go to the larger load, then to more
   decodes.

This is the max-weight (Tassiulas-Ephremides) rule on the vertices of the region: when
the decode queue is long relative to prefill it runs decode-heavy steps at the load
where they are fast (e.g. `(b0 - k_max + 1, k_max - 1)` and `(0, k_max)`), and when
prefill piles up it runs full prefill-heavy steps. Without `k_max` (and with `b / t(b)`
largest at `b_max`) every vertex has load `b_max` and the rule is work-conserving, like
Orca or Sarathi-Serve. It is not repeatable (the plan depends on the queues), so the
simulator plans every step.

Options (`make_batch_policy("adaptive:cost=paper")`, or keyword arguments):
- `cost`: the cost model spec the region is computed for. By default the driver's own
  model (the simulator and the virtual GPU bind theirs); `paper` if none is bound.
- `mean_prompt`, `mean_output`: workload means, used only by context-dependent cost
  models (timed as lengths that do not vary at them); otherwise estimated from the
  requests seen.
- `max_prompt`: the longest prompt expected (tokens), so that the region is capped from
  the first step on; a longer prompt seen still raises the cap.

With prefix caching, a waiting prompt's chunk on offer is net of its cached prefix (what
admitting it would compute); `Q_p` still counts waiting prompts whole.

Why requests under a cap: each queue's tokens weighed by the work one request brings to
it (`Q_p / m_p`, `Q_d / (m_o - 1)`, estimated by the request counts) is still max-weight,
for the Lyapunov function `Q_p^2 / m_p + Q_d^2 / (m_o - 1)`, but it no longer lets a
queue of long prompts outweigh the decoders behind them: the cap makes slots (one per
request in a step) the scarce resource, and a queue's claim on them is its requests, not
its tokens. Weighed by tokens, with prompts of 100 and outputs of 2 tokens under
`k_max` 2, a step of a prompt and a chunk of the next, (128, 0), outscored one of a prompt
and a decode, (100, 1), until the decode tokens owed reached 28 times the prefill tokens
waiting; the decoders piled up by thousands (20,000-request runs: inconclusive at 0.90 of
the region's `lambda*`, unstable at 0.94 and 0.97). Counted in requests, (128, 0) wins
only while the decoders are fewer than 28 times the waiting prompts: stable at 0.90-0.97
(docs/stability.md, with the cost: a longer TTFT where prompts are long). Without a
binding cap tokens are the only limit and the weights stay tokens.

Caveats: until a prompt is seen (without `max_prompt`) the region lets one request supply
a step's whole prefill chunk; a vertex needing more prefill than the prompts on offer hold
is realised with fewer prefill tokens. We have no proof of stability for this two-stage
system (prefill feeds decode), only the runs of docs/stability.md. `Q_d` uses the
requests' output lengths as the simulator knows them (a real engine would use the
requested maximum); under a binding cap only the decoding requests count.
"""

from __future__ import annotations

from ..core.checks import as_int, as_real
from ..core.constraints import k_max_binds
from ..core.cost import make_cost_model
from ..core.errors import ConfigError
from ..core.state import UNLIMITED
from .base import BatchPolicy, Planner


def _region():
    """core.region, imported when a region is first computed: it brings numpy (the LP), and
    the policy registry imports every policy module."""
    from ..core import region  # noqa: PLC0415

    return region


def _solve(cost, b_max: int, k_max: int | None, cap: int | None, mp: float | None, mo: float | None):
    """One region solve (a refit job): the vertex candidates `(load, decodes first)`, best
    first, and the step timer the scores use. Reads only its arguments."""
    region = _region()
    if cost.load_only:
        reg = region.stability_region(cost, b_max, k_max, max_prefill_per_request=cap)

        def timer(x, y):
            return cost.load_time(x + y)
    else:
        reg = region.stability_region(cost, b_max, k_max, mean_prompt=mp, mean_output=mo, max_prefill_per_request=cap)
        timer = region.representative_timer(cost, mp, mo)
    cands = set()
    for x, y, _t in reg.vertex_shapes:
        if x + y >= 1:
            load = int(x + y)
            if cost.load_only:  # same step time up to a larger load: use it too
                load = _same_time_reach(cost, load, b_max)
            cands.add((load, int(y)))
    return sorted(cands, key=lambda c: (-c[0], -c[1])), timer


def _same_time_reach(cost, load: int, b_max: int) -> int:
    """The largest load up to b_max whose step time, and every one's from `load` to it, is
    at most `load`'s (within 1e-12): a load-only model's loads in blocks of doubling size
    (`load_times`), as a const model's run to b_max."""
    import numpy as np  # noqa: PLC0415 (as _region: numpy only once a region is solved)

    t0 = cost.load_time(load) * (1 + 1e-12)
    n = 64
    while load < b_max:
        nxt = np.arange(load + 1, min(load + n, b_max) + 1, dtype=np.int64)
        over = np.flatnonzero(~(np.asarray(cost.load_times(nxt), dtype=float) <= t0))
        if len(over):
            return load + int(over[0])
        load = int(nxt[-1])
        n *= 2
    return load


class Adaptive(BatchPolicy):
    name = "adaptive"
    summary = (
        "max-weight over the stability region's vertex steps: picks each step's load "
        "and prefill/decode mix from the queues (stable inside the k_max region)"
    )
    work_conserving = False
    region_stable = True
    repeatable = False
    option_names = ("cost", "mean_prompt", "mean_output", "max_prompt")

    def __init__(
        self,
        cost=None,
        mean_prompt: float | None = None,
        mean_output: float | None = None,
        max_prompt: int | None = None,
    ):
        self.cost_spec = cost
        self.cost = make_cost_model("paper" if cost is None else cost)
        means = []
        for what, v in (("mean_prompt", mean_prompt), ("mean_output", mean_output)):
            x = None if v is None else as_real(v)
            if v is not None and not (x is not None and x >= 1):
                raise ConfigError(f"adaptive policy: {what} must be a number >= 1, got {v!r}")
            means.append(x)
        self.mean_prompt, self.mean_output = means
        longest = None if max_prompt is None else as_int(max_prompt)
        if max_prompt is not None and not (longest is not None and longest >= 1):
            raise ConfigError(
                "adaptive policy: max_prompt must be an integer number of tokens >= 1 (such as 4096), "
                f"got {max_prompt!r}"
            )
        self.max_prompt = longest
        self._key = None  # the region wanted: installed, or a job not yet installed
        self._regions: dict = {}  # key -> (vertex candidates, timer), for this cost model
        self._epoch = 0  # a job from an earlier binding or run is not installed
        self._job = None  # (key, job) due, not yet taken by a deferring driver
        #: set by a driver that runs refits off its step loop (`take_job`, `install_job`)
        self.defer_jobs = False
        self._cands: list[tuple[int, int]] = []
        self._times: dict[tuple[int, int], float] = {}
        self._server: tuple[int, int | None] | None = None  # (b_max, k_max) once bound
        self._start()

    def _start(self) -> None:
        """What a run learns, as a run starts: nothing seen yet."""
        self._longest = self.max_prompt or 0  # the longest prompt seen (or given)
        self._prompt_cap = self.max_prompt  # the region's cap: `_longest` as of its last refit
        self._steps = 0
        self._next_cap_refit = 0  # the step from which a longer prompt refits the region
        self._seen_ids: set[int] = set()
        self._sum_p = self._sum_o = self._n = 0
        self._next_refit = 1
        self.chosen: dict[tuple[int, int], int] = {}  # (load, decodes first) -> steps (diagnostics)

    def bind_constraints(self, constraints) -> None:
        """The server's b_max and k_max, when the scheduler is built: the region now."""
        self._server = (constraints.b_max, constraints.k_max or None)
        self._compute(*self._server)

    def bind_cost_model(self, cost) -> None:
        # an explicit `cost` option wins; the model bound already keeps its regions (the
        # simulator binds its model twice: the scheduler's maker, then the run)
        if self.cost_spec is None and cost is not self.cost:
            self.cost = cost
            self._key = None
            self._regions = {}
            self._forget_job()
            if self._server is not None:
                self._compute(*self._server)

    def reset(self) -> None:
        """A new run: the requests and prompts seen, the running means and the step
        counts start over (request ids start at 0 again: the ones seen would never be
        counted), and so does the region fitted to them (again only if it may have moved)."""
        ran = self._steps or self._n or self._longest != (self.max_prompt or 0) or self.chosen
        self._start()
        self._forget_job()
        if ran and self._server is not None:
            # the region a fresh policy computes at bind time (no request seen yet)
            self._key = None
            self._compute(*self._server)

    # ---- the region's vertices ------------------------------------------------------
    def _means(self):
        if self.mean_prompt is not None and self.mean_output is not None:
            return float(self.mean_prompt), float(self.mean_output)
        if self._n == 0:
            return None, None
        mp = self.mean_prompt if self.mean_prompt is not None else self._sum_p / self._n
        mo = self.mean_output if self.mean_output is not None else self._sum_o / self._n
        return float(mp), float(max(mo, 1.0))

    def _observe_arrivals(self, state) -> None:
        """Running means of the requests admitted so far (for context-dependent models): the
        running ones, decoders included (a prompt prefilled in one step is never seen
        prefilling between steps); no longer once the region is refitted no more."""
        if self._next_refit >= UNLIMITED:
            return
        for r in state.running.values():
            if r.id not in self._seen_ids and r.preemptions == 0:
                self._seen_ids.add(r.id)
                self._sum_p += r.prompt
                self._sum_o += r.output
                self._n += 1

    def _setup(self, state) -> None:
        """Before a step: the region for this state's server (a no-op when it is known)."""
        if not self.cost.load_only:
            self._observe_arrivals(state)
        self._compute(state.b_max, None if state.k_max >= UNLIMITED else int(state.k_max), self.defer_jobs)

    def _prefill_cap(self, b_max: int, k_max: int | None) -> int | None:
        """The region's `max_prefill_per_request`: the longest prompt known under a binding
        k_max, None (any number) without one or once it reaches b_max (no difference then)."""
        cap = self._prompt_cap
        return cap if cap is not None and cap < b_max and k_max_binds(b_max, k_max) else None

    def _refit_for_prompts(self, state) -> bool:
        """A prompt longer than the region's cap was seen: whether the region was refitted
        for it (never without a binding k_max, nor once the cap reaches b_max)."""
        k_max = None if state.k_max >= UNLIMITED else int(state.k_max)
        if not k_max_binds(state.b_max, k_max) or (self._prompt_cap or 0) >= state.b_max:
            self._next_cap_refit = UNLIMITED
            return False
        self._prompt_cap = self._longest
        self._next_cap_refit = 2 * self._steps
        self._compute(state.b_max, k_max, self.defer_jobs)
        return True

    def _compute(self, b_max: int, k_max: int | None, defer: bool = False) -> None:
        """The region's vertex shapes for this server, unless known (called every step);
        `defer`: leave a solve to the driver (`take_job`), the region in use serving until then."""
        cap = self._prefill_cap(b_max, k_max)
        if self.cost.load_only:
            key = (b_max, k_max, cap)
            if key == self._key:
                return
            job = (self.cost, b_max, k_max, cap, None, None)
        else:
            if self._key is not None and self._n < self._next_refit and self._key[:3] == (b_max, k_max, cap):
                return
            mp, mo = self._means()
            if mp is None:
                mp, mo = 1024.0, 256.0  # until a request is seen
            # refit at 1, 2, 4, ... requests seen (the first as soon as one is)
            self._next_refit = max(1, self._n * 2) if self._n < 4096 else UNLIMITED
            key = (b_max, k_max, cap, round(mp), round(mo))
            if key == self._key:
                return
            job = (self.cost, b_max, k_max, cap, mp, mo)
        self._key = key
        got = self._regions.get(key)
        if got is None:
            if defer:
                self._job = ((self._epoch, key), lambda: _solve(*job))  # a later refit replaces it
                return
            got = self._regions[key] = _solve(*job)
        self._job = None
        self._cands, self._time = got
        self._times = {}

    def _forget_job(self) -> None:
        """A binding or a run starts: a job due or running is for what came before."""
        self._job = None
        self._epoch += 1

    def take_job(self):
        """The refit due that `build` left to the driver (`defer_jobs`), as (key, a function
        of no arguments that solves it, pure: no state of the policy), or None; taken once.
        The driver runs it when it likes (the engine: on a worker thread) and passes the
        result to `install_job` between steps."""
        job, self._job = self._job, None
        return job

    def install_job(self, key, result) -> None:
        """The result of a job from `take_job`: the region from the next step on (a job is
        taken after the region in use was asked for, so it is newer), unless the policy
        was reset or rebound since; kept for its key."""
        epoch, k = key
        if epoch != self._epoch:
            return
        self._regions[k] = result
        # the region in use is the wanted key's once known: a job for a key the means left
        # (they came back to a key already solved, in use since) must not replace it
        if k == self._key or self._key not in self._regions:
            self._cands, self._time = result
            self._times = {}

    def drop_job(self, key) -> None:
        """The driver dropped a job from `take_job` without its result (the engine closed):
        its key is solved again when next wanted (else the region in use would stand for
        it until the means moved)."""
        epoch, k = key
        if epoch == self._epoch and k == self._key and k not in self._regions:
            self._key = None

    def _t(self, x: int, y: int) -> float:
        k = (x, y)
        t = self._times.get(k)
        if t is None:
            t = self._times[k] = self._time(x, y)
        return t

    # ---- one step -------------------------------------------------------------------
    @staticmethod
    def _weigh_requests(state) -> bool:
        """Whether the queues weigh by requests (a binding k_max) rather than tokens."""
        return k_max_binds(state.b_max, None if state.k_max >= UNLIMITED else int(state.k_max))

    @staticmethod
    def prefill_on_offer(p: Planner, cap: int) -> tuple[list[int], int, int, int]:
        """The prefill chunks a step could take, in the order the planner takes them
        (running prefills, then the waiting queue; a waiting prompt net of its cached
        prefix), until `cap` tokens or the planner's slots; with the running prefills'
        prefill and decode tokens still owed, and the longest prompt on offer."""
        state = p.state
        slots = p.slots
        rems = []
        acc = pre_pf = pre_dec = longest = 0
        for r in state.prefilling:
            rem = r.prefill_target - r.prefilled
            pre_pf += rem
            pre_dec += r.output - r.emitted - 1
            if acc < cap and len(rems) < slots:
                rems.append(rem)
                acc += rem
                if r.prompt > longest:
                    longest = r.prompt
        if acc < cap and len(rems) < slots:
            for r in state.waiting:
                rem = p.prefill_left(r)
                rems.append(rem)
                acc += rem
                if r.prompt > longest:
                    longest = r.prompt
                if acc >= cap or len(rems) >= slots:
                    break
        return rems, pre_pf, pre_dec, longest

    def build(self, p: Planner):
        state = p.state
        self._setup(state)
        self._steps += 1
        tokens, slots = p.tokens, p.slots
        n_dec = p.decodable
        reach = max(c[0] for c in self._cands) if self._cands else tokens
        rems, pre_pf, pre_dec, longest = self.prefill_on_offer(p, reach)
        if longest > self._longest:
            self._longest = longest
        if (
            self._longest > (self._prompt_cap or 0)
            and self._steps >= self._next_cap_refit
            and self._refit_for_prompts(state)
        ):
            new_reach = max(c[0] for c in self._cands) if self._cands else tokens
            if new_reach > reach:
                rems, pre_pf, pre_dec, _ = self.prefill_on_offer(p, new_reach)
        if self._weigh_requests(state):
            q_p, q_d = len(state.prefilling) + len(state.waiting), state.n_decoding
        else:
            q_p = state.pending_prefill
            waiting_pf = q_p - pre_pf
            q_d = (state.backlog_tokens - q_p) - (state.waiting_tokens - waiting_pf) - pre_dec
            if q_d < 0:
                q_d = 0
        best = None
        best_score = -1.0
        n_rems = len(rems)
        for load, yv in self._cands:
            lvl = min(load, tokens)
            # realise the vertex with y_v decodes; if the prefill requests its other slots
            # allow cannot fill the load (a prompt's last chunk is short), give a decode
            # slot to the next prompt instead, one at a time, until the load is filled
            y1 = min(yv, n_dec, lvl, slots)
            while True:
                budget, s = lvl - y1, slots - y1
                x = used = 0
                for rem in rems:
                    if budget <= 0 or used >= s:
                        break
                    c = rem if rem < budget else budget
                    x += c
                    budget -= c
                    used += 1
                y = y1
                y2 = min(n_dec - y1, budget, s - used)
                if y2 > 0:
                    y += y2
                if x + y > 0:
                    score = (q_p * x + q_d * y) / self._t(x, y)
                    if score > best_score * (1 + 1e-12):
                        best, best_score = (load, y1), score
                if y1 == 0 or x + y >= lvl or used < s or used >= n_rems:
                    break
                y1 -= 1
        if best is None:  # nothing realisable: behave like Sarathi-Serve
            best = (tokens, tokens)
        self.chosen[best] = self.chosen.get(best, 0) + 1
        load, y1 = best
        if load < p.tokens:
            p.tokens = load
        p.take_decodes(y1)
        p.take_running_prefills()
        p.admit_waiting()
        p.take_decodes()
        return p.plan(decode_first=True)
