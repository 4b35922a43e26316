"""The LMS planner, TensorFlow-free: what a training step (or an inference) holds, and a plan that fits.

Read in the order a plan is made::

    workload      Workload (model, input, batch, dtype policy, optimizer) and LMSOptions
                  (strategy, limit, margin, device rates): what is planned, checked when made
    memory_model  MemoryModel: every calibrated coefficient; memory_model_for(device, kind)
                  picks the CPU kind's preset (lms/presets) or the safe side
    layer_cost    one layer by the rule of its kind: tensors kept for backward, FLOPs, scratch
    cost          the whole network's cost tables (per block, persistent bytes, step FLOPs)
    step_time     how long a step takes on a CPU: padded convolution FLOPs, bytes touched,
                  coefficients measured per CPU model (lms/presets/step_time.json)
    timeline      memory over one step under a per-block plan (forward, loss, backward), its peak
    accounting    what a per-block choice costs: bytes kept and moved, FLOPs recomputed, seconds
    search        plan_lms: the strategies, auto's per-block search, what fits instead
    plan          Plan: its rows, table and JSON; PlanDoesNotFitError with the numbers and the fix
    capacity      the largest input, batch, patch or width a budget holds
                  (plan.find=max_input|max_batch|max_patch|max_width)
    inference     evaluation's and prediction's memory (whole volume, mirroring, native grid)
    preflight     plan_run and friends: a run's config in, its plan (or the refusal) out
    advice        after running out of memory: the settings predicted to fit (as overrides) and
                  OutOfMemoryError, whose message gives the plan's and the measured peak
    units         lms.limit parsing, sizes and shapes for printing

The public names are re-exported here, each imported on first use (so importing one module
of the planner does not import all of them); the modules import each other downwards only.
"""

_HOME = {  # public name -> its module; imported on first use, so importing one planner module stays cheap
    "MemoryFacts": "advice",
    "OutOfMemoryError": "advice",
    "Setting": "advice",
    "settings_that_fit": "advice",
    "Capacity": "capacity",
    "find_capacity": "capacity",
    "find_width": "capacity",
    "NetworkCost": "cost",
    "compute_network_cost": "cost",
    "compute_step_flops": "cost",
    "InferenceEstimate": "inference",
    "estimate_inference": "inference",
    "MemoryModel": "memory_model",
    "memory_model_for": "memory_model",
    "BlockPlan": "plan",
    "Plan": "plan",
    "PlanDoesNotFitError": "plan",
    "capacity_run": "preflight",
    "compare_run": "preflight",
    "plan_run": "preflight",
    "compare_strategies": "search",
    "estimate_peak": "search",
    "plan_lms": "search",
    "plan_lms_from_config": "search",
    "CpuTimeModel": "step_time",
    "cpu_time_model": "step_time",
    "POLICIES": "timeline",
    "Timeline": "timeline",
    "simulate": "timeline",
    "parse_limit": "units",
    "LMSOptions": "workload",
    "Workload": "workload",
}

__all__ = [
    "POLICIES",
    "BlockPlan",
    "Capacity",
    "InferenceEstimate",
    "LMSOptions",
    "MemoryFacts",
    "MemoryModel",
    "NetworkCost",
    "OutOfMemoryError",
    "Plan",
    "PlanDoesNotFitError",
    "Setting",
    "Timeline",
    "Workload",
    "capacity_run",
    "compare_run",
    "compare_strategies",
    "compute_network_cost",
    "compute_step_flops",
    "estimate_inference",
    "estimate_peak",
    "find_capacity",
    "memory_model_for",
    "parse_limit",
    "plan_lms",
    "plan_lms_from_config",
    "plan_run",
    "settings_that_fit",
    "simulate",
]


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
