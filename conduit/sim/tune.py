"""``conduit tune``: search the parameters a policy declares, on the simulator (the command itself
is :mod:`conduit.cli.tune`).

A policy declares what may be tuned in :attr:`Policy.space <conduit.policy.Policy.space>`: real or
integer ranges (optionally log-scaled) and sets of choices. :func:`tune` searches that space for one
workload on one topology and returns the best parameters it saw, measured against the policy's
defaults **in the same run** (same simulator, same iterations, same seed).

**Objective.** Mean iteration time by default (``iteration_time_s``), or mean exposed
experience-path latency (``exposed_experience_path_s``); either way ties — values within
:data:`TIE_TOLERANCE`, relative — are broken by the other metric. A run with audit violations (or one
whose parameters the policy refuses) is *infeasible* and can never be chosen, however fast it is.
The defaults are evaluated first and are only replaced by a strictly better feasible run, so the
result is never worse than the defaults.

**Refused before any simulation** (:func:`check_policy_space`): a space naming a parameter the
policy's factory does not take as a keyword (a factory with ``**kwargs`` takes any), and a policy
whose default value of a declared parameter lies outside that parameter's range or choices.

**Search**, in a unit cube with one coordinate per parameter (:func:`to_unit`/:func:`from_unit`):
reals map linearly or logarithmically onto ``[low, high]`` (rounded to :data:`SIGNIFICANT_DIGITS`
significant digits, so what is simulated is what is written); integers split the cube's axis into
one equal cell per integer — equal in log space for ``log`` parameters, so small values get more of
it — and choices into one equal cell per choice. Given a budget of *N* simulations:

1. the defaults (1 simulation);
2. a seeded Latin-hypercube design (``scipy.stats.qmc``) of about 40 % of the budget, which sees the
   whole space and tells which parameters matter;
3. a coordinate pattern search around the incumbent: per parameter a step up and a step down (reals
   by the current step, integers by at least one value, choices: every other choice), a successful
   step repeated while it keeps improving; when both steps lose, a real parameter tries the minimum
   of the parabola through the three points, and each range parameter once tries its *landmarks*
   (both ends of its range and its default — simulated responses are jagged, and systems knobs are
   often best at an end). The step halves after a sweep without progress. A parameter whose every
   probe tied with the incumbent is *flat* for this workload and is not probed again;
4. once the step is below 1/64 of an axis, every value of each small integer parameter that matters
   (at most :data:`SCAN_VALUES`), then seeded random points, any improvement restarting step 3;
5. the last simulations (reserved as flat parameters are found) set each flat parameter back to
   its default: among equally good results the one that changes fewer defaults wins, so the
   written file changes only what matters.

When every parameter is discrete and the whole space fits the budget it is simply enumerated.
Parameters already simulated are never simulated again (the budget counts distinct simulations), so
the search may stop early on a small discrete space. :func:`search_space` is the search alone, for
any objective function (the tests drive it with synthetic ones). Everything draws from one
``numpy.random.default_rng(seed)`` and the simulator runs with the same ``seed``: for a given seed the
search, its history and its result are identical from run to run, and
``conduit sim --params FILE --seed S --iterations K`` reproduces the tuned metrics exactly (the
file records ``seed`` and ``iterations``).
"""

from __future__ import annotations

import inspect
import itertools
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from conduit.errors import ConduitError
from conduit.policy import Param, Policy
from conduit.sim.fold import check_fold

if TYPE_CHECKING:  # numpy and scipy load on first use: `conduit --help` stays fast
    import numpy as np

OBJECTIVES = ("iteration_time_s", "exposed_experience_path_s")
DEFAULT_OBJECTIVE = "iteration_time_s"
DEFAULT_BUDGET = 24
DEFAULT_ITERATIONS = 10
#: objective values this close (relative) tie; the other objective breaks the tie
TIE_TOLERANCE = 1e-9
#: real-valued parameters are rounded to this many significant digits before they are simulated
SIGNIFICANT_DIGITS = 4
#: share of the budget (after the defaults) spent on the initial Latin-hypercube design
DESIGN_SHARE = 0.4
#: pattern-search step (fraction of a unit axis) at the start and at convergence
FIRST_STEP, MIN_STEP = 0.25, 1 / 64
#: integer parameters with at most this many values are scanned value by value at convergence
SCAN_VALUES = 16
#: proposals in a row that were all simulated before: the space is exhausted
_MAX_REPEATS = 2000


# ---------------------------------------------------------------------------------------- space
def check_space(space: Sequence[Param], policy: str = "policy") -> tuple[Param, ...]:
    """``space`` as a tuple, after checking every parameter is well formed (a ConduitError names
    the policy and the parameter otherwise)."""
    out = tuple(space)
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ConduitError(f"{policy}: space: duplicate parameter names {names}")
    for p in out:
        where = f"{policy}: space: parameter {p.name!r}"
        if p.choices is not None:
            if len(p.choices) == 0:
                raise ConduitError(f"{where}: choices is empty")
            continue
        if p.low is None or p.high is None:
            raise ConduitError(f"{where}: needs low and high, or choices")
        if not (math.isfinite(p.low) and math.isfinite(p.high)) or p.low > p.high:
            raise ConduitError(f"{where}: needs finite low <= high, got [{p.low}, {p.high}]")
        if p.log and p.low <= 0:
            raise ConduitError(f"{where}: log scale needs low > 0, got {p.low}")
        if p.integer and math.ceil(p.low) > math.floor(p.high):
            raise ConduitError(f"{where}: no integer in [{p.low}, {p.high}]")
    return out


def _int_bounds(p: Param) -> tuple[int, int]:
    return math.ceil(p.low), math.floor(p.high)


def _round_sig(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(round(x, digits - 1 - math.floor(math.log10(abs(x)))))


def from_unit(p: Param, u: float) -> Any:
    """The value of parameter ``p`` at coordinate ``u`` in [0, 1] (clipped into it)."""
    u = min(1.0, max(0.0, float(u)))
    if p.choices is not None:
        return p.choices[min(len(p.choices) - 1, int(u * len(p.choices)))]
    if p.integer:
        lo, hi = _int_bounds(p)
        # one equal cell per integer on [lo, hi + 1) (in log space for log parameters)
        if p.log:
            x = math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo)))
        else:
            x = lo + u * (hi + 1 - lo)
        return int(min(hi, max(lo, math.floor(x + 1e-9))))
    if p.log:
        x = math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low)))
    else:
        x = p.low + u * (p.high - p.low)
    return float(min(p.high, max(p.low, _round_sig(x))))


def to_unit(p: Param, value: Any) -> float:
    """The coordinate in [0, 1] of ``value`` (integers and choices: the middle of their cell;
    values outside the space: the nearest end)."""
    if p.choices is not None:
        index = _choice_index(p, value)
        return (index + 0.5) / len(p.choices)
    if p.integer:
        lo, hi = _int_bounds(p)
        k = int(min(hi, max(lo, round(float(value)))))
        if p.log:
            mid = 0.5 * (math.log(k) + math.log(k + 1))
            return (mid - math.log(lo)) / (math.log(hi + 1) - math.log(lo))
        return (k + 0.5 - lo) / (hi + 1 - lo)
    if p.high == p.low:
        return 0.5
    x = min(p.high, max(p.low, float(value)))
    if p.log:
        return (math.log(x) - math.log(p.low)) / (math.log(p.high) - math.log(p.low))
    return (x - p.low) / (p.high - p.low)


def _choice_index(p: Param, value: Any) -> int:
    for i, c in enumerate(p.choices):
        if c == value and type(c) is type(value):
            return i
    for i, c in enumerate(p.choices):
        if c == value:
            return i
    numeric = [i for i, c in enumerate(p.choices) if isinstance(c, (int, float)) and not isinstance(c, bool)]
    if numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
        return min(numeric, key=lambda i: abs(p.choices[i] - value))
    raise ConduitError(f"parameter {p.name!r}: {value!r} is not one of {list(p.choices)}")


def decode(space: Sequence[Param], u: Sequence[float]) -> dict[str, Any]:
    """Parameters at a point of the unit cube (one coordinate per parameter of ``space``)."""
    return {p.name: from_unit(p, x) for p, x in zip(space, u, strict=True)}


def encode(space: Sequence[Param], params: Mapping[str, Any]) -> np.ndarray:
    """The unit-cube point of ``params`` (a parameter missing from ``params`` sits mid-axis)."""
    import numpy as np

    return np.array([to_unit(p, params[p.name]) if p.name in params else 0.5 for p in space], dtype=float)


def clip(space: Sequence[Param], params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` moved into ``space``: reals clipped to ``[low, high]``, integers rounded and
    clipped, choices snapped to the nearest numeric choice (a non-numeric value that is not a choice
    is an error). Names not in ``space`` pass through unchanged."""
    out = dict(params)
    for p in space:
        if p.name not in out:
            continue
        v = out[p.name]
        if p.choices is not None:
            out[p.name] = p.choices[_choice_index(p, v)]
        elif p.integer:
            lo, hi = _int_bounds(p)
            out[p.name] = int(min(hi, max(lo, round(float(v)))))
        else:
            out[p.name] = float(min(p.high, max(p.low, float(v))))
    return out


def contains(space: Sequence[Param], params: Mapping[str, Any]) -> bool:
    """Whether every parameter of ``space`` in ``params`` is a legal value of it."""
    for p in space:
        if p.name not in params:
            continue
        v = params[p.name]
        if p.choices is not None:
            if not any(c == v and type(c) is type(v) for c in p.choices):
                return False
        elif p.integer:
            if not isinstance(v, int) or isinstance(v, bool) or not p.low <= v <= p.high:
                return False
        elif not isinstance(v, (int, float)) or isinstance(v, bool) or not p.low <= v <= p.high:
            return False
    return True


def allowed_values(p: Param) -> str:
    """What ``p`` admits, in words: ``one of [...]``, ``an integer in [lo, hi]`` or ``[low, high]``."""
    if p.choices is not None:
        return f"one of {list(p.choices)}"
    if p.integer:
        lo, hi = _int_bounds(p)
        return f"an integer in [{lo}, {hi}]"
    return f"[{p.low}, {p.high}]"


def _admits(p: Param, value: Any) -> bool:
    if p.choices is not None:
        return any(c == value and isinstance(c, bool) == isinstance(value, bool) for c in p.choices)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return False
    if p.integer and not float(value).is_integer():
        return False
    return p.low <= value <= p.high


def check_policy_space(space: Sequence[Param], params: Mapping[str, Any], keywords: Mapping[str, Any] | None,
                       policy: str = "policy") -> None:
    """Refuse a search space the policy cannot be tuned over (a ConduitError naming the policy, the
    parameter and what is allowed):

    * a parameter that is not a keyword of the policy's factory (``keywords``: the factory's keyword
      parameters with their defaults, :func:`conduit.registration.factory_keywords`; ``None`` for a
      factory that takes any keyword);
    * a parameter whose default — its value in ``params`` (the policy built with no arguments), else
      the factory's default for it — lies outside its declared range or choices."""
    if keywords is not None:
        for p in space:
            if p.name not in keywords:
                takes = ", ".join(keywords) if keywords else "no parameters"
                raise ConduitError(f"{policy}: search-space parameter {p.name!r} is not a keyword of the policy's "
                                   f"factory, which takes: {takes}")
    for p in space:
        if p.name in params:
            value = params[p.name]
        elif keywords is not None and keywords.get(p.name, inspect.Parameter.empty) is not inspect.Parameter.empty:
            value = keywords[p.name]
        else:
            continue
        if not _admits(p, value):
            raise ConduitError(f"{policy}: the default of parameter {p.name!r}, {value!r}, lies outside its "
                               f"declared range: {allowed_values(p)}")


def _lhs(d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    from scipy.stats import qmc

    try:
        engine = qmc.LatinHypercube(d, rng=rng)
    except TypeError:  # scipy < 1.15 names it seed
        engine = qmc.LatinHypercube(d, seed=rng)
    return engine.random(n)


def sample_space(space: Sequence[Param], rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
    """``n`` parameter sets from a Latin-hypercube design over ``space`` (seeded by ``rng``)."""
    space = check_space(space)
    if n <= 0 or not space:
        return []
    return [decode(space, u) for u in _lhs(len(space), n, rng)]


def space_size(space: Sequence[Param]) -> float:
    """Number of distinct points of ``space`` (``inf`` when a parameter is real)."""
    size = 1.0
    for p in space:
        if p.choices is not None:
            size *= len(p.choices)
        elif p.integer:
            lo, hi = _int_bounds(p)
            size *= hi - lo + 1
        else:
            return math.inf
    return size


def _grid(space: Sequence[Param]) -> list[dict[str, Any]]:
    axes = []
    for p in space:
        if p.choices is not None:
            axes.append(list(p.choices))
        else:
            lo, hi = _int_bounds(p)
            axes.append(list(range(lo, hi + 1)))
    return [dict(zip([p.name for p in space], values, strict=True)) for values in itertools.product(*axes)]


# ---------------------------------------------------------------------------------------- result
class Trial(NamedTuple):
    """One evaluated parameter set: the run's metrics (plus ``violations``; ``error`` when the
    policy or the simulator refused the parameters) and whether it may be chosen."""

    params: dict[str, Any]
    metrics: dict[str, Any]
    feasible: bool


@dataclass
class TuneResult:
    """What :func:`tune` found. ``history`` lists every simulation in the order it ran (the
    defaults first)."""

    policy: str
    topology: str
    workload: str
    objective: str
    budget: int
    seed: int
    iterations: int
    best_params: dict[str, Any]
    best_metrics: dict[str, Any]
    default_params: dict[str, Any]
    default_metrics: dict[str, Any]
    history: list[Trial] = field(default_factory=list)
    wall_s: float = 0.0
    #: every simulation's fold (:mod:`conduit.sim.fold`; 1: exact)
    fold: int = 1

    @property
    def simulations(self) -> int:
        return len(self.history)

    @property
    def improved(self) -> bool:
        """Whether the best differs from the defaults (it is then strictly better)."""
        return self.best_params != self.default_params

    def gain(self, metric: str) -> tuple[float, float]:
        """(defaults / best, percent reduction from defaults to best) for ``metric``."""
        return _gain(self.default_metrics.get(metric, math.nan), self.best_metrics.get(metric, math.nan))


def _gain(default: float, best: float) -> tuple[float, float]:
    if default is None or best is None or math.isnan(default) or math.isnan(best):
        return math.nan, math.nan
    ratio = default / best if best > 0 else (1.0 if default == best else math.inf)
    percent = 100.0 * (default - best) / default if default > 0 else 0.0
    return ratio, percent


def _finite(x: Any) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if math.isnan(x) else x


def _compare(a: Mapping[str, Any], b: Mapping[str, Any], keys: tuple[str, str]) -> int:
    """-1 when metrics ``a`` beat ``b``, 1 when they lose, 0 on a tie: lexicographic on ``keys``,
    values within :data:`TIE_TOLERANCE` (relative) equal."""
    for key in keys:
        x, y = _finite(a.get(key)), _finite(b.get(key))
        if x == y:
            continue
        if math.isinf(x) or math.isinf(y):
            return -1 if x < y else 1
        slack = TIE_TOLERANCE * max(abs(x), abs(y)) + 1e-15
        if x < y - slack:
            return -1
        if x > y + slack:
            return 1
    return 0


def _key(params: Mapping[str, Any]) -> tuple:
    return tuple((k, type(v).__name__, repr(v)) for k, v in sorted(params.items()))


# ---------------------------------------------------------------------------------------- search
class _Budget(Exception):
    """Raised inside the search when the simulation budget is spent."""


class _Search:
    """The bookkeeping of one tuning run: distinct simulations, the incumbent, the budget.

    The incumbent changes on a strictly better feasible run, or on a tie with it (both objectives)
    that differs from the defaults in fewer parameters: among equals, the simplest wins."""

    def __init__(self, space: tuple[Param, ...], evaluate: Callable[[dict[str, Any]], Trial], budget: int,
                 keys: tuple[str, str], defaults: dict[str, Any],
                 progress: Callable[[int, int], None] | None):
        self.space, self.evaluate, self.budget, self.keys = space, evaluate, budget, keys
        self.defaults, self.progress = defaults, progress
        self.history: list[Trial] = []
        self.seen: dict[tuple, Trial] = {}
        self.best: Trial | None = None
        self.repeats = 0
        #: parameters found flat (every probe tied); the final simplification resets them to default
        self.flat: list[str] = []
        self.finishing = False

    @property
    def reserved(self) -> int:
        """Simulations kept for :meth:`simplify`: one per flat parameter off its default."""
        if self.finishing or self.best is None:
            return 0
        return sum(1 for p in self.space if p.name in self.flat and self._resettable(p))

    def _resettable(self, p: Param) -> bool:
        return (p.name in self.defaults and contains((p,), self.defaults)
                and _key({p.name: self.best.params.get(p.name)}) != _key({p.name: self.defaults[p.name]}))

    def simplify(self) -> None:
        """Set each flat parameter back to its default, kept when the run ties (or beats) the best."""
        self.finishing = True
        for p in self.space:
            if p.name in self.flat and self._resettable(p):
                self.run({**self.best.params, p.name: self.defaults[p.name]})

    @property
    def left(self) -> int:
        return self.budget - len(self.history)

    def _changed(self, params: Mapping[str, Any]) -> int:
        return sum(_key({k: v}) != _key({k: self.defaults.get(k)}) for k, v in params.items())

    def run(self, params: dict[str, Any]) -> tuple[Trial, str]:
        """Simulate ``params`` unless already simulated. Returns the trial and how it compares with
        the incumbent *before* it: ``better``, ``tie`` or ``worse`` (infeasible runs are worse)."""
        key = _key(params)
        if key in self.seen:
            self.repeats += 1
            if self.repeats > _MAX_REPEATS:
                raise _Budget  # the space is exhausted
            trial = self.seen[key]
            if trial is self.best:
                return trial, "tie"
            return trial, self._status(trial)
        if self.left <= self.reserved:
            raise _Budget
        self.repeats = 0
        trial = self.evaluate(params)
        self.seen[key] = trial
        self.history.append(trial)
        if self.progress is not None:
            self.progress(len(self.history), self.budget)
        status = self._status(trial)
        if status == "better" or (status == "tie" and self._changed(trial.params) < self._changed(self.best.params)):
            self.best = trial
        return trial, status

    def _status(self, trial: Trial) -> str:
        if not trial.feasible:
            return "worse"
        if self.best is None:
            return "better"
        return ("better", "tie", "worse")[_compare(trial.metrics, self.best.metrics, self.keys) + 1]

    def at(self, u: np.ndarray) -> tuple[Trial, str]:
        return self.run(decode(self.space, u))


def _neighbours(space: tuple[Param, ...], u: np.ndarray, d: int, direction: int, step: float) -> list[np.ndarray]:
    """Points one step from ``u`` along axis ``d`` that change the parameter's value."""
    p = space[d]
    current = from_unit(p, u[d])
    if p.choices is not None:  # unordered: every other choice, tried once per sweep (direction +1)
        if direction < 0:
            return []
        out = []
        for i in range(len(p.choices)):
            if i != _choice_index(p, current):
                v = u.copy()
                v[d] = (i + 0.5) / len(p.choices)
                out.append(v)
        return out
    v = u.copy()
    v[d] = min(1.0, max(0.0, u[d] + direction * step))
    if from_unit(p, v[d]) == current:
        if not p.integer:
            return []
        lo, hi = _int_bounds(p)
        nxt = current + direction
        if not lo <= nxt <= hi:
            return []
        v[d] = to_unit(p, nxt)
    return [v]


def _pattern_search(search: _Search, rng: np.random.Generator) -> None:
    """Coordinate pattern search around the incumbent, then seeded random restarts (see the module
    docstring). Returns when the budget is spent or the space is exhausted (via :class:`_Budget`).

    Per sweep and coordinate: a step up, a step down; the first strict improvement is taken and
    repeated while it pays. When neither helps, a real parameter tries the minimum of the parabola
    through the three points, and then the axis' *landmarks* — both ends and the default —
    are tried once (simulated responses are often jagged, and systems knobs are often best at an
    end of their range). A coordinate whose step probes all tied with the incumbent is *flat* for
    this workload: it is left alone until the next restart, so the budget goes to the parameters that
    do matter, and one simulation is kept to set it back to its default at the end
    (:meth:`_Search.simplify`: a tie there is adopted, so the result changes only what matters)."""
    space = search.space
    step = FIRST_STEP
    flat = [False] * len(space)
    landmarked = [False] * len(space)
    while True:
        while step >= MIN_STEP:
            progressed = False
            for d, p in enumerate(space):
                if flat[d]:
                    continue
                outcomes: list[str] = []
                probes: dict[int, Trial] = {}
                centre = encode(space, search.best.params)
                for direction in (1, -1):
                    for cand in _neighbours(space, centre, d, direction, step):
                        trial, status = search.at(cand)
                        outcomes.append(status)
                        probes[direction] = trial
                        if status == "better":
                            break
                    if outcomes and outcomes[-1] == "better":
                        progressed = True
                        while p.choices is None:  # keep going while it pays
                            nxt = _neighbours(space, encode(space, search.best.params), d, direction, step)
                            if not nxt or search.at(nxt[0])[1] != "better":
                                break
                        break
                if progressed and outcomes[-1] == "better":
                    continue
                if outcomes and all(s == "tie" for s in outcomes):
                    flat[d] = True
                    if p.name not in search.flat:
                        search.flat.append(p.name)
                    continue
                if _parabola(search, d, centre, step, probes):
                    progressed = True
                elif not landmarked[d] and p.choices is None:
                    landmarked[d] = True
                    # an end beyond an infeasible step is left out: infeasibility rarely ends there
                    for value in _landmarks(p, search.defaults, low=not _failed(probes, -1),
                                            high=not _failed(probes, 1)):
                        if search.run({**search.best.params, p.name: value})[1] == "better":
                            progressed = True
                            break
            if not progressed:
                step /= 2
        # converged: every value of each small integer parameter that matters (the default first),
        # the others held — a neighbourhood the steps skip when the response has several valleys
        if _scan_integers(search, flat):
            step = FIRST_STEP / 2
            continue
        # then explore until something beats the incumbent, and refine again
        while True:
            if search.at(rng.random(len(space)))[1] == "better":
                step, flat, landmarked = FIRST_STEP / 2, [False] * len(space), [False] * len(space)
                break


def _parabola(search: _Search, d: int, centre: np.ndarray, step: float, probes: dict[int, Trial]) -> bool:
    """For a real parameter bracketed by two worse probes one ``step`` either side of the incumbent,
    try the minimum of the parabola through the three (successive parabolic interpolation); whether
    it improved the incumbent."""
    p = search.space[d]
    if p.choices is not None or p.integer or set(probes) != {1, -1} or not all(t.feasible for t in probes.values()):
        return False
    key = search.keys[0]
    lo, mid, hi = (_finite(t.metrics.get(key)) for t in (probes[-1], search.best, probes[1]))
    curvature = lo - 2 * mid + hi
    if not all(map(math.isfinite, (lo, mid, hi))) or curvature <= 0:
        return False
    u = centre.copy()
    u[d] = min(1.0, max(0.0, centre[d] + step * (lo - hi) / (2 * curvature)))
    return search.at(u)[1] == "better"


def _failed(probes: Mapping[int, Trial], direction: int) -> bool:
    return direction in probes and not probes[direction].feasible


def _landmarks(p: Param, defaults: Mapping[str, Any], *, low: bool = True, high: bool = True) -> list[Any]:
    """Both ends of a range parameter's axis (those asked for), then its default (when it lies in
    the space)."""
    out = [from_unit(p, 0.0)] * low + [from_unit(p, 1.0)] * high
    if p.name in defaults and contains((p,), defaults) and defaults[p.name] not in out:
        out.append(defaults[p.name])
    return out


def _scan_integers(search: _Search, flat: list[bool]) -> bool:
    """Try every value of each non-flat integer parameter with at most :data:`SCAN_VALUES` values
    around the incumbent (its default first); whether the incumbent improved."""
    improved = False
    for d, p in enumerate(search.space):
        if flat[d] or p.choices is not None or not p.integer:
            continue
        lo, hi = _int_bounds(p)
        if hi - lo + 1 > SCAN_VALUES:
            continue
        values = list(range(lo, hi + 1))
        default = search.defaults.get(p.name)
        if default in values:
            values.remove(default)
            values.insert(0, default)
        for v in values:
            if search.run({**search.best.params, p.name: v})[1] == "better":
                improved = True
    return improved


def search_space(space: Sequence[Param], evaluate: Callable[[dict[str, Any]], Trial], defaults: Mapping[str, Any],
                 *, budget: int, seed: int = 0, objective: str = DEFAULT_OBJECTIVE, tie_break: str | None = None,
                 progress: Callable[[int, int], None] | None = None) -> tuple[Trial | None, list[Trial]]:
    """The search behind :func:`tune`, for any ``evaluate(params) -> Trial`` (lower metrics are better).

    ``defaults`` are evaluated first; then, within ``budget`` distinct evaluations, the seeded search
    the module docstring describes. Returns the best feasible trial (``None`` when none was, or when
    the defaults could not be evaluated at all — their metrics carry ``error``) and every trial in
    the order it ran."""
    space = check_space(space)
    keys = (objective, tie_break or objective)
    search = _Search(space, evaluate, int(budget), keys, dict(defaults), progress)
    import numpy as np

    rng = np.random.default_rng(seed)
    default_trial, _ = search.run(dict(defaults))
    if "error" in default_trial.metrics:
        return None, search.history
    try:
        grid = _grid(space) if space_size(space) <= budget else None
        if grid is not None and sum(_key(g) not in search.seen for g in grid) <= search.left:
            for params in grid:
                search.run(params)
        else:
            n_design = min(search.left, max(1, round(DESIGN_SHARE * (budget - 1))))
            for params in sample_space(space, rng, n_design):
                search.run(params)
            while search.best is None:  # nothing feasible yet: keep exploring until something is
                search.at(rng.random(len(space)))
            _pattern_search(search, rng)
    except _Budget:
        pass
    if search.best is not None:
        try:
            search.simplify()
        except _Budget:
            pass
    return search.best, search.history


def tune(topology: Any, workload: Any, policy: str | Callable[..., Policy], *, budget: int = DEFAULT_BUDGET,
         seed: int = 0, iterations: int = DEFAULT_ITERATIONS, objective: str = DEFAULT_OBJECTIVE,
         progress: Callable[[int, int], None] | None = None, stock_costs: Any = None, fold: int = 1) -> TuneResult:
    """Search ``policy``'s declared parameters (:attr:`Policy.space`) on the simulator.

    ``topology`` and ``workload`` may be names, paths or objects; ``policy`` a registered name or a
    factory taking the parameters as keywords. ``budget`` is the number of simulations (the defaults
    included), each ``iterations`` learner updates with simulator seed ``seed``, which also seeds
    the search. ``objective`` is ``iteration_time_s`` or ``exposed_experience_path_s`` (lower is
    better; ties broken by the other). ``progress(done, budget)`` is called after each simulation.
    ``stock_costs``: the :class:`~conduit.sim.params.StockCosts` every simulation uses, as
    :func:`conduit.simulate` takes them (a file, a mapping or the object; default: the built-in ones); the
    deployed plane's model pays the stock sampler's, RPC and connector costs from it too.
    ``fold``: every simulation folded (:mod:`conduit.sim.fold`: one representative per ``fold`` identical
    nodes besides the driver's; PPO and GRPO), so that a search at 1,024 GPUs takes minutes; an
    approximation (iteration time within about 0.3% at 1,024 GPUs, ``benchmarks/sim_speed.py --fold``),
    so a candidate that wins by less than that is not a finding. Recorded in the result and the tuned file.
    Raises :class:`ConduitError` for a policy without tunable parameters, one whose space the policy
    cannot be tuned over (:func:`check_policy_space`; both before any simulation), a budget below 1,
    an unknown objective, or when no evaluated parameter set — the defaults included — is feasible.
    """
    from conduit.registration import factory_keywords
    from conduit.registry import create_policy, policy_registry
    from conduit.sim.cost_file import resolve_stock_costs
    from conduit.sim.engine import Simulation
    from conduit.sim.workload import load_workload
    from conduit.topology import Topology, load_topology

    started = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ConduitError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
        raise ConduitError(f"budget must be an integer >= 1 (simulations, the defaults included), got {budget!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) or iterations < 1:
        raise ConduitError(f"iterations must be an integer >= 1, got {iterations!r}")
    budget, iterations, seed = int(budget), int(iterations), int(seed)
    if isinstance(policy, str):
        if policy == "janus-best":
            raise ConduitError("policy 'janus-best' declares no tunable parameters: it is itself an exhaustive "
                               "search over the janus-* configurations (tune 'janus' to search them)")
        name = policy
        keywords = policy_registry().entry(name).keywords()

        def factory(**kw: Any) -> Policy:
            return create_policy(name, **kw)
    elif callable(policy) and not isinstance(policy, Policy):
        factory = policy
        keywords = factory_keywords(policy)
    else:
        raise ConduitError("tune needs a registered policy name or a policy factory (it rebuilds the policy "
                           f"for every candidate), got {type(policy).__name__}")
    default_policy = factory()
    if not isinstance(default_policy, Policy):
        raise ConduitError(f"policy {policy!r} is not a complete policy (got {type(default_policy).__name__})")
    label = policy if isinstance(policy, str) else default_policy.name
    if not default_policy.space:
        takes = (f" (it takes parameters {sorted(default_policy.params)} but declares no search space for them)"
                 if default_policy.params else "")
        raise ConduitError(f"policy {label!r} declares no tunable parameters: its Policy.space is empty{takes}; "
                           "nothing to tune")
    space = check_space(default_policy.space, f"policy {label!r}")
    check_policy_space(space, default_policy.params, keywords, f"policy {label!r}")
    defaults = {p.name: default_policy.params[p.name] for p in space if p.name in default_policy.params}

    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    wl = load_workload(workload)
    check_fold(fold, wl)  # before any simulation
    stock, stock_source = resolve_stock_costs(stock_costs)
    keys = (objective, next(o for o in OBJECTIVES if o != objective))

    def evaluate(params: dict[str, Any]) -> Trial:
        try:
            # the defaults are the policy built with no parameters given, as enable() without params/params_file
            # deploys it (a given parameter changes the deployment: conduit.deploy_settings); a candidate's
            # parameters are all given, as the tuned file that enable(params_file=...) reads gives them
            pol = factory() if params == defaults else factory(**params)
            result = Simulation(topo, wl, pol, iterations=iterations, seed=seed, stock=stock,
                                stock_source=stock_source, fold=fold).run()
        except ConduitError as exc:
            return Trial(dict(params), {"error": str(exc)}, False)
        metrics = {k: _plain(v) for k, v in result.metrics.items()}
        metrics["violations"] = int(result.audit.violations)
        feasible = metrics["violations"] == 0 and not math.isinf(_finite(metrics.get(objective)))
        return Trial(dict(params), metrics, feasible)

    best, history = search_space(space, evaluate, defaults, budget=budget, seed=seed, objective=objective,
                                 tie_break=keys[1], progress=progress)
    default_trial = history[0]
    if "error" in default_trial.metrics:
        raise ConduitError(f"policy {label!r}: its defaults {defaults} cannot be simulated: "
                           f"{default_trial.metrics['error']}")
    if math.isinf(_finite(default_trial.metrics.get(objective))):
        raise ConduitError(f"objective {objective!r} is undefined for {wl.name} with {iterations} iteration(s) "
                           f"(the first updates are warm-up, not measured): use more iterations")
    if best is None:
        raise ConduitError(f"policy {label!r}: none of the {len(history)} parameter sets simulated for "
                           f"{wl.name} on {topo.name} was feasible (the defaults had "
                           f"{default_trial.metrics.get('violations')} audit violation(s)); nothing to choose")
    return TuneResult(
        policy=label, topology=topo.name, workload=wl.name, objective=objective, budget=budget, seed=seed,
        iterations=iterations, best_params=dict(best.params), best_metrics=dict(best.metrics),
        default_params=dict(defaults), default_metrics=dict(default_trial.metrics), history=history,
        wall_s=time.perf_counter() - started, fold=fold,
    )


def _plain(v: Any) -> Any:
    """numpy scalars as Python numbers (JSON-friendly)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return v


def _json_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else _plain(v)) for k, v in metrics.items()}


def write_result(result: TuneResult, path: str | Path | None = None) -> Path:
    """Save ``result`` with :func:`conduit.tuning_file.save_params` (default
    ``results/tuned-<policy>-<workload>-<topology>.json``, creating the folder)."""
    from conduit.tuning_file import save_params

    if path is None:
        path = Path("results") / f"tuned-{result.policy}-{result.workload}-{result.topology}.json"
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_params(
            path, result.policy, result.best_params, topology=result.topology, workload=result.workload,
            objective=result.objective, default_params=result.default_params,
            default_metrics=_json_metrics(result.default_metrics), best_metrics=_json_metrics(result.best_metrics),
            budget=result.budget, simulations=result.simulations, seed=result.seed, iterations=result.iterations,
            **({"fold": result.fold} if result.fold != 1 else {}),
        )
    except OSError as exc:
        raise ConduitError(f"{path}: cannot write: {exc.strerror or exc}") from None
