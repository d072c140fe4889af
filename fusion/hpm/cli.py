"""`dynfuse hpm calibrate | train | eval`: build the calibration dataset, fit the model, measure its quality.

dynfuse hpm calibrate --samples 5000 -o data/                     # a seeded sweep of calibration groups
dynfuse hpm calibrate --model m.onnx --input x=x.npy -o data/     # the kernels of your own model, added to data/
dynfuse hpm train data/ -o hpm.npz
dynfuse hpm eval data/ [--model hpm.npz]                          # default: $DYNFUSE_HPM_MODEL or the shipped one
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fusion.hpm.cost_model import MODEL_ENV, default_model_path, print_warning
from fusion.hpm.errors import HpmError
from fusion.hpm.model import ALGORITHMS
from fusion.tasks import add_runner_options, make_runner


def register(subparsers: argparse._SubParsersAction) -> None:
    hpm = subparsers.add_parser("hpm", help="hardware performance model: calibrate on the simulator, train, evaluate")
    sub = hpm.add_subparsers(dest="hpm_command", required=True, metavar="ACTION")

    cal = sub.add_parser("calibrate", help="simulate a seeded sweep of candidate kernels into a dataset")
    cal.add_argument("--configs", default="base,tiny", help="comma-separated machine presets the variants start from")
    cal.add_argument("--samples", type=int, default=1000, help="groups (seeds) to measure; each gives several kernels")
    cal.add_argument("--seed", type=int, default=0, help="first group seed")
    add_runner_options(cal)  # --workers, --address (a Ray cluster), --backend
    cal.add_argument("--jobs", type=int, dest="workers", help=argparse.SUPPRESS)  # the old name of --workers
    cal.add_argument("--heldout-share", type=float, default=0.1, help="share of groups run on the held-out machine")
    cal.add_argument("--no-progress", action="store_true", help="no progress bar")
    cal.add_argument("--model", type=Path, help="an ONNX model: measure its candidate kernels instead of a sweep")
    cal.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="--model's inputs")
    cal.add_argument("--dtype", default="fp32", choices=("fp32", "int8"), help="--model's dtype")
    cal.add_argument("-o", "--output", type=Path, required=True, help="dataset directory (resumed if it exists)")
    cal.set_defaults(run=run_calibrate)

    tr = sub.add_parser("train", help="fit the model on a dataset's training split and save it")
    tr.add_argument("data", type=Path, help="dataset directory or .npz file")
    tr.add_argument("-o", "--output", type=Path, required=True, help="model file to write (.npz)")
    tr.add_argument("--algo", choices=ALGORITHMS, default=ALGORITHMS[0], help="gradient-boosted trees, forest or MLP")
    tr.add_argument("--all", action="store_true", help="train on every row (no held-out split)")
    tr.add_argument("--seed", type=int, default=0)
    tr.set_defaults(run=run_train)

    ev = sub.add_parser("eval", help="score a model (and the analytic one) on the dataset's held-out sets")
    ev.add_argument("data", type=Path, help="dataset directory or .npz file")
    ev.add_argument("--model", type=Path, help=f"model file (default: ${MODEL_ENV}, else the shipped model)")
    ev.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    ev.add_argument("--json", action="store_true", help="print the figures as JSON")
    ev.set_defaults(run=run_eval)


def run_calibrate(args: argparse.Namespace) -> int:
    from fusion.hpm.sweep import run_sweep

    bases = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not bases:
        raise HpmError("--configs needs at least one machine preset")
    if args.model is not None:
        return _calibrate_workload(args, bases)
    if args.input:
        raise HpmError("--input gives the inputs of --model; a sweep draws its own")
    if not 0.0 <= args.heldout_share < 1.0:
        raise HpmError(f"--heldout-share must be in [0, 1), got {args.heldout_share}")
    runner = make_runner(args.backend, args.workers, args.address)
    result = run_sweep(
        args.output, bases, args.samples, args.seed, heldout_share=args.heldout_share,
        progress=not args.no_progress, runner=runner,
    )  # fmt: skip
    print(
        f"{result.dataset}: {result.rows} kernels from {result.groups - result.failed} groups "
        f"({result.measured_now} measured now, {result.failed} could not be built)"
    )
    return 0


def _calibrate_workload(args: argparse.Namespace, bases: list[str]) -> int:
    from fusion.hpm.workload import calibrate_workload
    from simulator.inputs import parse_input_args

    if not args.model.is_file():
        raise HpmError(f"no such model file: {args.model}")
    result = calibrate_workload(args.output, args.model, parse_input_args(args.input), bases, args.dtype)
    print(
        f"{result.dataset}: {result.measured} kernels of {args.model.name} measured now "
        f"({result.failed} rejected by the simulator); {result.rows} workload kernels in {args.output}"
    )
    return 0


def run_train(args: argparse.Namespace) -> int:
    from fusion.hpm.dataset import load_dataset
    from fusion.hpm.evaluate import split
    from fusion.hpm.model import train_on
    from fusion.hpm.modelfile import save_model

    if args.output.is_dir():
        raise HpmError(f"-o {args.output} is a directory; give the model file's path (e.g. {args.output / 'hpm.npz'})")
    ds = load_dataset(args.data)
    part = ds if args.all else ds.subset(split(ds)["train"])
    meta = {"dataset": args.data.name, "split": "all" if args.all else "train", "dataset_meta": ds.meta}
    model = train_on(part, args.algo, args.seed, meta)
    save_model(model, args.output)
    print(
        f"{args.output}: {args.algo} on {len(part)} kernels ({model.meta['train_seconds']} s), "
        f"kernel generators {model.generators}"
    )
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from fusion.hpm.dataset import load_dataset
    from fusion.hpm.evaluate import evaluate, write_plots
    from fusion.hpm.modelfile import load_model

    ds = load_dataset(args.data)
    model = load_model(args.model or default_model_path(), check_generators=False)
    if model.generators != ds.meta.get("generators"):
        print_warning(
            f"the model was calibrated on kernel generators {model.generators}, the dataset measured "
            f"{ds.meta.get('generators')}: its figures describe other kernels"
        )
    ev = evaluate(ds, model)
    if args.plots:
        for path in write_plots(ev, args.plots):
            print(f"wrote {path}")
    if args.json:
        print(json.dumps(ev.as_dict(), indent=2))
        return 0
    head = ("set", "model", "n", "cycle MAPE", "energy MAPE", "tau", "regret", "groups")
    print("{:<16} {:<9} {:>6} {:>11} {:>12} {:>6} {:>7} {:>6}".format(*head))
    for name, models in ev.sets.items():
        for model, s in models.items():
            print(
                f"{name:<16} {model:<9} {s.samples:>6} {100 * s.cycle_mape:>10.2f}% {100 * s.energy_mape:>11.2f}% "
                f"{s.kendall_tau:>6.3f} {100 * s.mean_regret:>6.2f}% {s.groups:>6}"
            )
    return 0
