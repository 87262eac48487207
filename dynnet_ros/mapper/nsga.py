"""The NSGA-II run over a search space (``mapper.search``): pymoo's optimiser, seeded and reproducible.

Apart from ``search`` so that what a serving node imports (spaces, candidates, the pick rules)
does not load pymoo's optimiser and the SciPy it pulls in; ``dynnet map search`` and the
benchmarks run it.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.callback import Callback
from pymoo.core.problem import Problem
from pymoo.core.repair import Repair
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.optimize import minimize

from dynnet_ros.mapper.search import Candidate, SearchResult, Space, pareto_front


class _Problem(Problem):
    def __init__(self, space: Space, archive: dict[tuple, tuple[Candidate, tuple[float, ...]]]) -> None:
        probe = space.decode(np.full(space.n_var, 0.5))
        super().__init__(n_var=space.n_var, n_obj=3, n_ieq_constr=len(space.violations(probe)), xl=0.0, xu=1.0)
        self.space = space
        self.archive = archive

    def _evaluate(self, x, out, *args, **kwargs):
        objectives, constraints = [], []
        for row in x:
            candidate = self.space.decode(row)
            violations = self.space.violations(candidate)
            self.archive.setdefault(candidate.key(), (candidate, violations))
            objectives.append((candidate.latency_ms, candidate.energy_mj, -candidate.accuracy))
            constraints.append(violations)
        out["F"] = np.array(objectives)
        out["G"] = np.array(constraints)


class _Snap(Repair):
    """Genes to the centre of the choice they select, after the decoder's own repairs: equal
    candidates get equal genomes, so NSGA-II's duplicate elimination sees them."""

    def _do(self, problem, x, **kwargs):
        return np.array([problem.space.encode(problem.space.decode(row)) for row in x])


class _Progress(Callback):
    def __init__(self, on_generation: Callable[[int], None] | None) -> None:
        super().__init__()
        self.on_generation = on_generation

    def notify(self, algorithm):
        if self.on_generation is not None:
            self.on_generation(algorithm.n_gen)


def run_search(space: Space, *, generations: int = 40, population: int = 40, seed: int = 0,
               on_generation: Callable[[int], None] | None = None) -> SearchResult:
    """NSGA-II for ``generations`` × ``population``; the baselines are seeded into the first
    population so the front is never worse than a single-unit mapping."""
    if generations < 1 or population < 2:
        raise ValueError("the search needs >= 1 generation and a population of >= 2")
    archive: dict[tuple, tuple[Candidate, tuple[float, ...]]] = {}
    problem = _Problem(space, archive)
    baselines = space.baselines()
    rng = np.random.default_rng(seed)
    start = np.array([space.encode(b) for b in baselines][:population]
                     + [space.encode(space.decode(row)) for row in rng.random((population, space.n_var))])
    algorithm = NSGA2(pop_size=population, sampling=start[:population], crossover=SBX(prob=0.9, eta=15),
                      mutation=PM(eta=20), repair=_Snap(), eliminate_duplicates=True)
    began = time.perf_counter()
    minimize(problem, algorithm, ("n_gen", generations), seed=seed, callback=_Progress(on_generation), verbose=False)
    seconds = time.perf_counter() - began
    feasible = [c for c, v in archive.values() if all(g <= 0 for g in v)]
    return SearchResult(tuple(pareto_front(feasible)), tuple(baselines), len(archive), len(feasible), seconds,
                        generations, population, seed, tuple(feasible))
