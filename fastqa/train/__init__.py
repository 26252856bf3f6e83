"""Model-agnostic training: the loop, atomic checksummed checkpoints, EMA, LR schedules, torchrun/DDP set-up,
stopping on signals, the run-folder lock and the machine's GEMM engine decisions."""
from .checkpoint import inference_weights, load_checkpoint, save_checkpoint
from .ema import EMA
from .interrupt import TrainingInterrupted
from .loop import Task, TrainSettings, fit, seed_everything
from .schedules import inverse_sqrt, log_warmup

__all__ = ["EMA", "Task", "TrainSettings", "TrainingInterrupted", "fit",
           "inference_weights", "inverse_sqrt", "load_checkpoint", "log_warmup", "save_checkpoint", "seed_everything"]
