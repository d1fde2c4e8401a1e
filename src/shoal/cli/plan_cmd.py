"""`shoal plan CLUSTER --model MODEL`: lay a model over a cluster and say how fast a step is,
beside a random and a greedy layout of the same shape judged by the same cost model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

RANDOM_LAYOUTS = 20


def plan_command(
    cluster_file: Path = typer.Argument(..., help="The cluster: a .json or .toml file."),
    model: str = typer.Option(..., "--model", help="A preset (gpt3-xl, tiny-gpt) or a profile "
                              "file (.json or .toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    seed: int = typer.Option(0, "--seed", help="Seed of the search and the random layouts."),
) -> None:
    """Plan data- and pipeline-parallel layout, sync mode and codec for a cluster."""
    from shoal.plan import (
        InvalidCluster, SearchConfig, greedy_layout, model_preset, parse_cluster, parse_model,
        random_layouts, search, to_plan, topology,
    )

    if not cluster_file.is_file():
        raise InvalidCluster(f"cluster file {cluster_file} not found; give a .json or .toml file")
    cluster = parse_cluster(cluster_file.read_text(encoding="utf-8"), str(cluster_file))
    model_path = Path(model)
    profile = (parse_model(model_path.read_text(encoding="utf-8"), model)
               if model_path.suffix in (".json", ".toml") and model_path.is_file()
               else model_preset(model))
    top = topology(cluster)
    start = time.perf_counter()
    layout = search(top, profile, SearchConfig(seed=seed))
    search_s = time.perf_counter() - start
    plan = to_plan(top, profile, layout)
    randoms = random_layouts(top, profile, plan.dp, plan.pp, RANDOM_LAYOUTS, seed)
    random_s = float(np.median([r.step_s for r in randoms]))
    greedy_s = greedy_layout(top, profile, plan.dp, plan.pp).step_s
    if as_json:
        typer.echo(json.dumps({
            "step_time_s": plan.step_time_s, "random_step_time_s": random_s,
            "greedy_step_time_s": greedy_s, "dp": plan.dp, "pp": plan.pp,
            "stages": [list(s) for s in plan.stages], "layers": list(plan.layers),
            "unused": list(plan.unused), "mode": plan.mode.value,
            "inner_steps": plan.inner_steps, "codec": plan.codec.value, "slt": plan.slt,
            "breakdown": plan.breakdown.model_dump(), "search_s": search_s,
            "model": profile.name, "devices": top.size,
        }))
        return
    _print(plan, random_s, greedy_s, search_s, profile.name)


def _print(plan, random_s: float, greedy_s: float, search_s: float, model: str) -> None:  # noqa: ANN001
    console = Console()
    sync = plan.mode.value + (f" ({plan.inner_steps} inner steps)" if plan.inner_steps > 1 else "")
    sync += f", slt {plan.slt}" if plan.slt else ""
    console.print(f"[bold]{model}[/]: {plan.dp} replicas x {plan.pp} stages, {sync}, "
                  f"codec {plan.codec.value}; planned in {search_s:.2f} s")
    stages = Table("stage", "layers", "devices")
    for j, (names, layers) in enumerate(zip(plan.stages, plan.layers)):
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
        stages.add_row(str(j), str(layers), shown)
    console.print(stages)
    if plan.unused:
        console.print(f"unused: {', '.join(plan.unused)}")
    times = Table("layout", "step time (s)", "vs shoal")
    b = plan.breakdown
    times.add_row(f"shoal (pipeline {b.pipeline_s:.3f} s + exchange {b.exchange_s:.3f} s)",
                  f"{plan.step_time_s:.3f}", "1.00")
    times.add_row(f"random (median of {RANDOM_LAYOUTS}, same shape)", f"{random_s:.3f}",
                  f"{random_s / plan.step_time_s:.2f}")
    times.add_row("greedy (by region, same shape)", f"{greedy_s:.3f}",
                  f"{greedy_s / plan.step_time_s:.2f}")
    console.print(times)
