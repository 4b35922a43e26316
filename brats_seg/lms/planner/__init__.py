"""The LMS planner, TensorFlow-free: what a training step (or an inference) holds, and a plan that fits.

Read in the order a plan is made::

    workload      Workload (model, input, batch, dtype policy, optimizer) and LMSOptions
                  (strategy, limit, margin, device rates): what is planned, checked when made
    memory_model  MemoryModel: every calibrated coefficient; memory_model_for(device, kind)
                  picks the CPU kind's preset (lms/presets) or the safe side
    layer_cost    one layer by the rule of its kind: tensors kept for backward, FLOPs, scratch
    cost          the whole network's cost tables (per block, persistent bytes, step FLOPs)
    timeline      memory over one step under a per-block plan (forward, loss, backward), its peak
    accounting    what a per-block choice costs: bytes kept and moved, FLOPs recomputed, seconds
    search        plan_lms: the strategies, auto's per-block search, what fits instead
    plan          Plan: its rows, table and JSON; PlanDoesNotFitError with the numbers and the fix
    capacity      the largest input or batch a budget holds (plan.find=max_input|max_batch)
    inference     evaluation's and prediction's memory (whole volume, mirroring, native grid)
    preflight     plan_run and friends: a run's config in, its plan (or the refusal) out
    units         lms.limit parsing, sizes and shapes for printing

The public names are re-exported here; the modules import each other downwards only.
"""

from brats_seg.lms.planner.capacity import Capacity, find_capacity
from brats_seg.lms.planner.cost import NetworkCost, compute_network_cost, compute_step_flops
from brats_seg.lms.planner.inference import InferenceEstimate, estimate_inference
from brats_seg.lms.planner.memory_model import MemoryModel, memory_model_for
from brats_seg.lms.planner.plan import BlockPlan, Plan, PlanDoesNotFitError
from brats_seg.lms.planner.preflight import capacity_run, compare_run, plan_run, planning_device
from brats_seg.lms.planner.search import compare_strategies, estimate_peak, plan_lms, plan_lms_from_config
from brats_seg.lms.planner.timeline import POLICIES, Timeline, simulate
from brats_seg.lms.planner.units import format_bytes, parse_limit
from brats_seg.lms.planner.workload import STRATEGIES, LMSOptions, Workload

__all__ = [
    "POLICIES", "STRATEGIES", "BlockPlan", "Capacity", "InferenceEstimate", "LMSOptions", "MemoryModel",
    "NetworkCost", "Plan", "PlanDoesNotFitError", "Timeline", "Workload", "capacity_run", "compare_run",
    "compare_strategies", "compute_network_cost", "compute_step_flops", "estimate_inference", "estimate_peak",
    "find_capacity", "format_bytes", "memory_model_for", "parse_limit", "plan_lms", "plan_lms_from_config",
    "plan_run", "planning_device", "simulate",
]
