"""A third task, wholly in this file: ``ToyTask``'s regression (``toy_task``) as a ``TaskSpec`` with a command
that trains it (``toy-train``), one that answers with it (``toy-predict``), a predictor and a route of
``fastqa serve`` (``POST /toy``). Registered with ``fastqa.tasks.add_task(SPEC)``, it needs no line of the
package changed: the proof that a task is one spec."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fastqa.tasks.spec import ReferenceRun, Serving, TaskSpec, weights_dtype

KIND = "toy"  # ToyTask's checkpoint kind


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("toy-train", help="train the toy regression")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.set_defaults(func=_run_train)
    p = subparsers.add_parser("toy-predict", help="y for one x")
    p.add_argument("--model", required=True)
    p.add_argument("--x", required=True, help="six numbers, comma-separated")
    p.set_defaults(func=_run_predict)


def _run_train(args: argparse.Namespace) -> int:
    import torch
    from toy_task import ToyTask

    from fastqa.train import TrainSettings, fit

    torch.set_num_threads(1)
    task = ToyTask(dropout=0.0)
    task.command, task.preset = "toy-train", "tiny"
    task.reference_run = SPEC.reference_run(task.kind, task.preset)  # what the trainer's expectation line quotes
    fit(task, TrainSettings(out_dir=args.out, max_steps=args.steps, log_every=1, progress=False, eval_every=0))
    return 0


def _run_predict(args: argparse.Namespace) -> int:
    model = SPEC.load(args.model, device="cpu")
    print(json.dumps({"y": model.predict([[float(v) for v in args.x.split(",")]])[0]}))
    return 0


class ToyRegressor:
    """The predictor: a trained toy MLP giving y for each x."""

    def __init__(self, model: Any, device: Any) -> None:
        self.model, self.device = model, device

    @classmethod
    def load(cls, name_or_path: Any = None, *, device: Any = None, layers: Any = None, threads: Any = None,
             precision: Any = None) -> "ToyRegressor":
        from torch import nn

        from fastqa.tasks.loading import load_weights, open_model
        from fastqa.train.distributed import default_device

        payload, where, meta = open_model(name_or_path, "no-shipped-toy", SPEC.kinds, "a toy model")
        hidden = meta["config"]["hidden"]
        model = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Dropout(0.0), nn.Linear(hidden, 1))
        load_weights(model, payload, where)
        device = default_device(device)
        return cls(model.to(device).eval(), device)

    def predict(self, xs: list[list[float]]) -> list[float]:
        import torch

        with torch.no_grad():
            return self.model(torch.tensor(xs, device=self.device)).squeeze(1).tolist()


class ToyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    x: list[float] = Field(min_length=6, max_length=6)


class ToyResponse(BaseModel):
    y: float


@dataclass(frozen=True)
class ToyItem:
    x: tuple[float, ...]


SERVING = Serving(route="/toy", name="toy", summary="y for one x.", request_schema=lambda limits: ToyRequest,
                  response_schema=ToyResponse, item=lambda request: ToyItem(tuple(request.x)), key=lambda item: 0,
                  run=lambda model, items: model.predict([list(it.x) for it in items]),
                  respond=lambda request, y: {"y": y},
                  describe=lambda model: {"device": str(model.device), "dtype": weights_dtype(model.model)},
                  warm_up=lambda model: model.predict([[0.0] * 6]))

SPEC = TaskSpec(name="toy", commands=__name__, predictor=f"{__name__}:ToyRegressor", kinds=(KIND,),
                serving=f"{__name__}:SERVING", serve_flag="--toy-model", serve_help="a toy-train run folder",
                reference_runs={(KIND, "tiny"): ReferenceRun(result="a toy loss", steps=5, minutes=0.1,
                                                             machine="any CPU", early="nothing")})


def main(argv: list[str]) -> int:
    """``fastqa`` with the toy task registered (what the serve test starts as a process of its own)."""
    from fastqa.cli import main as fastqa_main
    from fastqa.tasks import add_task

    add_task(SPEC)
    return fastqa_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
