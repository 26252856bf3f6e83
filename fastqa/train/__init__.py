"""Model-agnostic training: the loop, atomic checkpoints, EMA, LR schedules, torchrun/DDP set-up."""
from .checkpoint import inference_weights, load_checkpoint, save_checkpoint
from .ema import EMA
from .loop import Task, TrainSettings, fit, seed_everything
from .schedules import inverse_sqrt, log_warmup

__all__ = ["EMA", "Task", "TrainSettings", "fit",
           "inference_weights", "inverse_sqrt", "load_checkpoint", "log_warmup", "save_checkpoint", "seed_everything"]
