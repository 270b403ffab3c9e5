"""Study: the tuning loop end to end -- ``conduit tune`` on this machine's calibrated topology, then the
tuned parameters against the defaults in a real RLlib run.

    python studies/tune_loop.py [--calibration FILE] [--workload ppo-largeobs-1r-1l] [--budget 16]
        [--predict-only] [--iters 9] [--warmup 1] [--out results/tune_loop]

1. The topology, the simulator's workload and its stock costs come from the calibration exactly as in
   ``studies/validation.py`` (:func:`validation.topology_from_calibration`, :func:`validation.build_workloads`
   of the experience-path study's own config; the calibration is ``--calibration FILE``, else
   ``results/validation/calibration.json`` when it exists, else measured now).
2. :func:`conduit.sim.tune.tune` searches the ``conduit`` policy's declared parameters for that workload
   (objective: iteration time; seed 0) and writes the best to ``OUT/tuned-conduit.json``
   (:func:`conduit.sim.tune.write_result`): the **predicted gain** is default / tuned iteration time.
3. The same workload runs for real twice on the Conduit side, through ``studies/rllib_experience_path.py``'s
   runner (own interpreter each): ``enable(config)`` (the defaults) and ``enable(config,
   params_file=OUT/tuned-conduit.json)``; the **measured gain** is the ratio of their median iteration times.
4. ``OUT/tune_loop.json`` and ``OUT/tune_loop.md`` put the two gains side by side and, for every parameter
   the search changed, what the simulator does with it and what the runtime does with it
   (:func:`mechanisms`): a prediction that the runtime does not confirm is a finding, and the report says
   which mechanism the simulator assumed that the runtime lacks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conduit.studies import load_script

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = Path(__file__).resolve().parent
DEFAULT_CALIBRATION = Path("results/validation/calibration.json")


def _validation() -> Any:
    """``studies/validation.py``, loaded by path (studies are scripts, not a package)."""
    return load_script(HERE / "validation.py")


def mechanisms(workload: Any, default: Mapping[str, Any], tuned: Mapping[str, Any]) -> list[dict[str, Any]]:
    """For each parameter the search changed: what the simulator does with it, and what the runtime does.

    Read off the code (cited), with this workload's numbers:

    - ``target_chunk_bytes``: under ``enable()`` an EnvRunner streams each PPO ``sample()`` call to the plane
      in sub-chunks while it samples (``conduit/runtime/rllib/env_runner.py: sample``, one stock sampler call
      and one ingest per sub-chunk). Their size is :func:`conduit.deploy_settings.stream_chunk_steps`: the
      given ``target_chunk_bytes`` at the layout's bytes per step (``plan.py: Plan.stream_chunk_steps``), else
      an eighth of the fragment. The simulator's deployed model calls the same function
      (``conduit/sim/deployed.py: deployed_stream_pieces``), so both cut the fragment alike;
    - ``granularity``: the simulator coalesces that many chunks per copy; the runtime too
      (``conduit/runtime/assembly.py: _start_moves``);
    - ``depth``: the prefetch depth, :func:`conduit.deploy_settings.prefetch_depth` on both sides (the
      runtime's ``plan.py: make_plan`` and the simulator's ``deployed_prefetch_depth``): a given ``depth``
      unless ``enable(prefetch_depth=...)`` is passed; it matters to replay (DQN/SAC) and APPO/IMPALA
      learners' prefetch threads (``delivery.py: Prefetcher``), not to PPO's value stream;
    - ``headroom``: the placement's free-room margin, in both (one plane core)."""
    from conduit.deploy_settings import stream_chunk_steps

    out = []
    for name in sorted(set(default) | set(tuned)):
        if default.get(name) == tuned.get(name):
            continue
        row: dict[str, Any] = {"parameter": name, "default": default.get(name), "tuned": tuned.get(name)}
        if name == "target_chunk_bytes":
            envs = max(1, int(workload.envs_per_runner))
            frag = int(workload.fragment_length) * envs
            d_steps = stream_chunk_steps(frag, envs)
            t_steps = stream_chunk_steps(frag, envs, float(workload.bytes_per_step), float(tuned[name]))
            row["simulator"] = (f"a {workload.chunk_bytes / 1e6:.1f} MB fragment ({frag} steps) is streamed in "
                                f"sub-chunks of {d_steps} steps without the parameter, {t_steps} tuned "
                                f"(conduit/sim/deployed.py: deployed_stream_pieces)")
            row["runtime"] = ("the EnvRunner streams sample() in sub-chunks of the same size "
                              "(conduit/deploy_settings.py: stream_chunk_steps, via plan.py: Plan.stream_chunk_steps "
                              "and env_runner.py: sample)")
            row["honoured_by_runtime"] = True
        elif name == "granularity":
            row["simulator"] = "coalesces that many chunks per copy"
            row["runtime"] = "coalesces up to that many chunks per copy job (conduit/runtime/assembly.py: _start_moves)"
            row["honoured_by_runtime"] = True
        elif name == "depth":
            row["simulator"] = "batches a deployed learner's prefetch thread keeps fetched (deployed_prefetch_depth)"
            row["runtime"] = ("the same depth (conduit/deploy_settings.py: prefetch_depth, via plan.py: make_plan), "
                              "unless enable(prefetch_depth=...) is passed; PPO's value stream does not prefetch")
            row["honoured_by_runtime"] = True
        else:
            row["simulator"] = row["runtime"] = "the plane core's placement (shared)"
            row["honoured_by_runtime"] = True
        out.append(row)
    return out


def _gain(default: float | None, tuned: float | None) -> float | None:
    if default is None or tuned is None or not (math.isfinite(default) and math.isfinite(tuned)) or tuned <= 0:
        return None
    return default / tuned


def markdown(report: Mapping[str, Any]) -> str:
    def f(x: Any, spec: str) -> str:
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)

    p, m = report["predicted"], report["measured"]
    lines = ["# The tuning loop, end to end", "",
             (f"Workload {report['workload']} on the calibrated topology {report['topology']} "
             f"(calibration: {report['calibration_source']}); `conduit tune` budget {report['budget']}, "
             f"{report['sim_iterations']} iterations, seed 0; params file `{report['params_file']}`."),
             f"Load average during the real runs: {report['load']}.", "",
             "| parameter | default | tuned |", "|---|---:|---:|"]
    for k in sorted(report["default_params"]):
        lines.append(f"| {k} | {report['default_params'][k]} | {report['tuned_params'].get(k)} |")
    lines += ["", "| | default | tuned | gain (default / tuned) |", "|---|---:|---:|---:|",
              (f"| predicted iteration time (s) | {f(p['default_iteration_s'], '.4g')} | "
              f"{f(p['tuned_iteration_s'], '.4g')} | {f(p['gain'], '.3f')} |"),
              (f"| measured iteration time (s, median of {m.get('iterations', '-')}) | "
              f"{f(m.get('default_iteration_s'), '.4g')} | {f(m.get('tuned_iteration_s'), '.4g')} | "
              f"{f(m.get('gain'), '.3f')} |"), ""]
    lines.append(f"**Verdict:** {report['verdict']}")
    if report["mechanisms"]:
        lines += ["", "## What each changed parameter does", "",
                  "| parameter | simulator | runtime | runtime honours it |", "|---|---|---|---|"]
        for r in report["mechanisms"]:
            lines.append(f"| {r['parameter']} | {r['simulator']} | {r['runtime']} | "
                         f"{'yes' if r['honoured_by_runtime'] else 'no'} |")
    return "\n".join(lines) + "\n"


def verdict(predicted_gain: float | None, measured_gain: float | None, mechs: Sequence[Mapping[str, Any]],
            noise: float = 0.05) -> str:
    """One sentence: whether the real run confirms the prediction (within ``noise``), and why not."""
    if predicted_gain is None:
        return "no prediction"
    if predicted_gain <= 1.0:
        return "the search found nothing better than the defaults: nothing to confirm"
    if measured_gain is None:
        return f"predicted gain {predicted_gain:.3f}x; no real run (--predict-only)"
    ignored = [r["parameter"] for r in mechs if not r["honoured_by_runtime"]]
    if predicted_gain < 1.0 + noise and measured_gain < 1.0 - noise:
        return (f"NOT confirmed: the simulator predicted a gain ({predicted_gain:.3f}x) below the {noise:.0%} noise "
                f"floor, and the real run measured the tuned parameters SLOWER ({measured_gain:.3f}x). "
                + (f"The runtime does not implement what the simulator credits to {', '.join(ignored)} (table below); "
                   if ignored else "")
                + "on a loaded shared machine repeat runs differ by more than the floor, so rerun quietly before "
                  "reading it as a loss.")
    if predicted_gain < 1.0 + noise:
        return (f"the predicted gain ({predicted_gain:.3f}x) is below the {noise:.0%} run-to-run noise of this shared "
                f"machine, so the real run ({measured_gain:.3f}x measured) can neither confirm nor refute it: on this "
                f"workload the simulator itself says the conduit policy's parameters hardly matter.")
    why = (f" The runtime does not implement what the simulator credits to {', '.join(ignored)} (table below): "
           f"the prediction rests on a mechanism the deployed runtime lacks." if ignored else
           " Every changed parameter is honoured by the runtime; the gap is the model's error on this workload.")
    if measured_gain >= 1.0 + noise:
        return (f"confirmed: the tuned parameters beat the defaults in the real run ({measured_gain:.3f}x measured, "
                f"{predicted_gain:.3f}x predicted).")
    return (f"NOT confirmed: predicted {predicted_gain:.3f}x, measured {measured_gain:.3f}x (within the "
            f"{noise:.0%} run-to-run noise of this shared machine counts as no gain)." + why)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibration", type=Path, help=f"calibration JSON (default: {DEFAULT_CALIBRATION} if it exists, "
                                                    f"else measured now)")
    p.add_argument("--workload", default="ppo-largeobs-1r-1l", help="a workload of studies/rllib_experience_path.py")
    p.add_argument("--budget", type=int, default=16, help="conduit tune's simulations")
    p.add_argument("--sim-iterations", type=int, default=6)
    p.add_argument("--predict-only", action="store_true")
    p.add_argument("--iters", type=int, default=9)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("results/tune_loop"))
    p.add_argument("--report-only", action="store_true",
                   help="rewrite OUT/tune_loop.md (and the verdict) from OUT/tune_loop.json; no simulation, no run")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        report = json.loads((args.out / "tune_loop.json").read_text())
        report["verdict"] = verdict(report["predicted"]["gain"], report["measured"].get("gain"), report["mechanisms"])
        (args.out / "tune_loop.json").write_text(json.dumps(report, indent=1, default=float))
        (args.out / "tune_loop.md").write_text(markdown(report))
        print(markdown(report))
        return 0
    val = _validation()
    study = val.experience_path_study()
    known = {w.name: w for w in study.WORKLOADS}
    if args.workload not in known:
        print(f"error: unknown workload {args.workload}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    configs = val.study_configs(study, study.parse_args([]), [args.workload])
    path = args.calibration or (DEFAULT_CALIBRATION if DEFAULT_CALIBRATION.exists() else None)
    if path is not None:
        calibration, source = json.loads(Path(path).read_text()), str(path)
    else:
        calibration = val.calibrate(configs, quick=False)
        (args.out / "calibration.json").write_text(json.dumps(calibration, indent=1))
        source = f"{args.out / 'calibration.json'} (measured now)"
    topology, _ = val.topology_from_calibration(calibration)
    # the workload and its stock costs exactly as validation.py predicts them
    stock, _fresh = val.with_fresh_mapping(val.stock_costs_from_primitives(), calibration, True)
    workloads, stocks = val.build_workloads(configs, calibration, stock)
    workload, stock = workloads[args.workload], stocks[args.workload]

    from conduit.sim.tune import tune, write_result

    print(f"conduit tune: {args.workload} on {topology.name}, budget {args.budget} ...", flush=True)
    result = tune(topology, workload, "conduit", budget=args.budget, seed=0, iterations=args.sim_iterations,
                  stock_costs=stock)
    params_file = write_result(result, args.out / "tuned-conduit.json")
    p_default = float(result.default_metrics["iteration_time_s"])
    p_tuned = float(result.best_metrics["iteration_time_s"])
    predicted = {"default_iteration_s": p_default, "tuned_iteration_s": p_tuned, "gain": _gain(p_default, p_tuned),
                 "default_exposed_s": float(result.default_metrics["exposed_experience_path_s"]),
                 "tuned_exposed_s": float(result.best_metrics["exposed_experience_path_s"])}
    print(f"  predicted iteration time: default {p_default:.4g} s, tuned {p_tuned:.4g} s "
          f"(gain {predicted['gain']:.3f}x); params {result.best_params}", flush=True)

    measured: dict[str, Any] = {}
    load = "no real runs (--predict-only)"
    if not args.predict_only:
        before = os.getloadavg()
        meds = {}
        for label, options in (("default", {}), ("tuned", {"params_file": str(params_file.resolve())})):
            run_args = study.parse_args(["--iters", str(args.iters), "--warmup", str(args.warmup),
                                         "--enable-options", json.dumps(options)])
            t = time.time()
            rows = study.run_isolated(known[args.workload], "conduit", run_args)
            med = study.medians(rows)
            print(f"  real run, conduit side, {label} params: {len(rows)} iterations in {time.time() - t:.0f} s",
                  flush=True)
            meds[label] = med[0] if med else {}
        after = os.getloadavg()
        load = f"1-min {before[0]:.2f} before, {after[0]:.2f} after; 15-min {after[2]:.2f} on {os.cpu_count()} cores"
        d = meds["default"].get("iteration_ms")
        tu = meds["tuned"].get("iteration_ms")
        measured = {"default_iteration_s": None if d is None else d / 1e3,
                    "tuned_iteration_s": None if tu is None else tu / 1e3,
                    "default_exposed_s": meds["default"].get("exposed_per_update_ms", math.nan) / 1e3,
                    "tuned_exposed_s": meds["tuned"].get("exposed_per_update_ms", math.nan) / 1e3,
                    "iterations": meds["default"].get("iterations"), "medians": meds}
        measured["gain"] = _gain(measured["default_iteration_s"], measured["tuned_iteration_s"])
    mechs = mechanisms(workload, result.default_params, result.best_params)
    report = {
        "workload": args.workload, "topology": topology.name, "calibration_source": source,
        "budget": args.budget, "sim_iterations": args.sim_iterations, "params_file": str(params_file),
        "default_params": result.default_params, "tuned_params": result.best_params,
        "predicted": predicted, "measured": measured, "mechanisms": mechs, "load": load,
        "verdict": verdict(predicted["gain"], measured.get("gain"), mechs), "wall_s": time.time() - t0,
        "sim_workload": workload.to_dict(),
    }
    (args.out / "tune_loop.json").write_text(json.dumps(report, indent=1, default=float))
    text = markdown(report)
    (args.out / "tune_loop.md").write_text(text)
    print()
    print(text)
    print(f"written {args.out}/tune_loop.json, tune_loop.md, {params_file.name}; {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
