"""The heterogeneity-aware planner: how to lay a model over devices and slow, uneven links.

Pure (numpy and the standard library): a cost model of one training step,
a search over layouts in the spirit of DT-FM's scheduler, the choice of
synchronization mode and codec, and re-planning when membership changes.
"""

from shoal.plan.cluster import Topology, model_preset, parse_cluster, parse_model, topology
from shoal.plan.cost import CostConfig, Costs, evaluate
from shoal.plan.errors import InvalidCluster, ModelDoesNotFit, PlanError, UnknownModel
from shoal.plan.exhaustive import exhaustive
from shoal.plan.planner import greedy_layout, layout_of, plan, random_layouts, replan, to_plan
from shoal.plan.search import Layout, SearchConfig, search
from shoal.plan.sync import SyncConfig, SyncOption, ladder

__all__ = [
    "CostConfig", "Costs", "InvalidCluster", "Layout", "ModelDoesNotFit", "PlanError",
    "SearchConfig", "SyncConfig", "SyncOption", "Topology", "UnknownModel", "evaluate",
    "exhaustive", "greedy_layout", "ladder", "layout_of", "model_preset", "parse_cluster",
    "parse_model", "plan", "random_layouts", "replan", "search", "to_plan", "topology",
]
